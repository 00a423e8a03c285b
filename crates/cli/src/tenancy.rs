//! `basalt project …`, `basalt token …`, `basalt nbd-key …` and `basalt
//! type …`: tenants and their quotas, API tokens, NBD TLS keys, volume
//! types. One REST call each, printed as a
//! table or key/value block, or as the API's JSON with `--output json`.

use crate::client::{ApiClient, ClientArgs, Output};
use crate::commands::{decode, parse_qos, path_segment, print_json};
use crate::output::{fields, table, Align};
use anyhow::{bail, Result};
use basalt_api::types::{
    CreatedNbdKey, CreatedToken, NbdKeyList, Project, ProjectList, Token, TokenList, VolumeType,
    VolumeTypeList,
};
use basalt_volume::qos::QosSpec;
use basalt_volume::{format_size, parse_size};
use clap::{Subcommand, ValueEnum};
use serde_json::{json, Map, Value};

/// Quota flags shared by `project create` and `project set-quota`: a
/// number (a size for capacity), or `none` to lift the quota.
#[derive(clap::Args, Debug, Default)]
pub struct QuotaArgs {
    /// Most provisioned capacity, e.g. 10T (sum of the project's volume
    /// sizes), or none.
    #[arg(long, value_name = "SIZE|none")]
    capacity: Option<String>,
    /// Most volumes (clones included), or none.
    #[arg(long, value_name = "N|none")]
    volumes: Option<String>,
    /// Most snapshots, or none.
    #[arg(long, value_name = "N|none")]
    snapshots: Option<String>,
}

impl QuotaArgs {
    /// The API's quota object: given quotas only, `null` for `none`.
    fn to_json(&self) -> Result<Map<String, Value>> {
        let mut out = Map::new();
        let quotas = [
            ("capacity_bytes", &self.capacity, true),
            ("volumes", &self.volumes, false),
            ("snapshots", &self.snapshots, false),
        ];
        for (key, value, is_size) in quotas {
            let Some(text) = value else { continue };
            let value = if text == "none" {
                Value::Null
            } else if is_size {
                json!(parse_size(text)?)
            } else {
                match text.parse::<u64>() {
                    Ok(n) => json!(n),
                    Err(_) => bail!("invalid --{}: {text:?} is not a count or none", key),
                }
            };
            out.insert(key.to_string(), value);
        }
        Ok(out)
    }
}

#[derive(Subcommand, Debug)]
pub enum ProjectCommand {
    /// Create a project (cluster admins): a tenant whose tokens see only
    /// its volumes.
    Create {
        /// Project name: the rules of volume names.
        name: String,
        #[arg(long)]
        description: Option<String>,
        #[command(flatten)]
        quotas: QuotaArgs,
    },
    /// List projects with their quotas and use.
    List,
    /// Show one project.
    Show { name: String },
    /// Change a project's quotas (cluster admins); flags not given stay.
    SetQuota {
        name: String,
        #[command(flatten)]
        quotas: QuotaArgs,
    },
    /// Delete a project with its tokens and NBD keys (refused while it has
    /// volumes).
    Delete { name: String },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum RoleArg {
    Admin,
    Member,
}

#[derive(Subcommand, Debug)]
pub enum TokenCommand {
    /// Create an API token; it is printed once and stored only hashed.
    Create {
        /// The project it acts in (without: a cluster-wide admin token).
        #[arg(long)]
        project: Option<String>,
        /// admin: the project's volumes and tokens (without --project: the
        /// whole cluster); member: the project's volumes.
        #[arg(long, value_enum)]
        role: RoleArg,
        /// Lifetime, e.g. 30d or 12h (default: until revoked).
        #[arg(long, value_name = "DURATION")]
        expires: Option<String>,
        #[arg(long)]
        description: Option<String>,
    },
    /// List tokens (never their secrets).
    List {
        #[arg(long)]
        project: Option<String>,
    },
    /// Revoke a token: refused from then on, on every node.
    Revoke { id: String },
}

#[derive(Subcommand, Debug)]
pub enum NbdKeyCommand {
    /// Create a pre-shared key for NBD over TLS (the server's --nbd-listen
    /// address). Prints its keys.psk line (IDENTITY:HEXKEY) once: give it
    /// to qemu's tls-creds-psk (a keys.psk file in its dir) or libnbd's
    /// tls-psk-file, with nbds://IDENTITY@HOST:PORT/VOLUME.
    Create {
        /// The project whose volumes it opens (without: every volume,
        /// cluster admins only).
        #[arg(long)]
        project: Option<String>,
        #[arg(long)]
        description: Option<String>,
    },
    /// List NBD keys (never the keys).
    List,
    /// Revoke an NBD key: no new TLS session with it.
    Revoke { identity: String },
}

#[derive(Subcommand, Debug)]
pub enum TypeCommand {
    /// Create a volume type (cluster admins): replica count and QoS limits
    /// that volumes created with --type TYPE get.
    Create {
        /// Type name: the rules of volume names.
        name: String,
        /// Replicas of its volumes, 1-5 (default: the cluster's).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=5))]
        replicas: Option<u32>,
        /// QoS limits as for `volume set-qos`, e.g. total_iops_sec=5000.
        #[arg(long, value_name = "SPEC")]
        qos: Option<String>,
        /// Only this project may use it (repeat for several; default: all).
        #[arg(long = "project", value_name = "PROJECT")]
        projects: Vec<String>,
        /// Its volumes are encrypted at rest (the server needs a master
        /// key: basalt server --master-key-file).
        #[arg(long)]
        encrypted: bool,
        /// Its volumes' cold data is kept compressed: lz4, zstd,
        /// zstd:LEVEL (1-19) or off (a volume created with --compression
        /// keeps that instead).
        #[arg(long, value_name = "CODEC")]
        compression: Option<String>,
        #[arg(long)]
        description: Option<String>,
        /// Also make it the default type.
        #[arg(long)]
        default: bool,
    },
    /// List the volume types this token may use.
    List,
    /// Show one volume type.
    Show { name: String },
    /// Delete a volume type (refused while volumes have it).
    Delete { name: String },
    /// Make a type the one volumes get when created without --type (none:
    /// no default).
    SetDefault {
        #[arg(value_name = "TYPE|none")]
        name: String,
    },
}

fn project_path(name: &str) -> String {
    format!("/api/v1/projects/{}", path_segment(name))
}

fn quota_text(limit: Option<u64>, used: Option<u64>, size: bool) -> String {
    let show = |n: u64| if size { format_size(n) } else { n.to_string() };
    let used = used.map_or_else(|| "?".into(), show);
    match limit {
        Some(limit) => format!("{used} of {}", show(limit)),
        None => format!("{used} (unlimited)"),
    }
}

fn project_fields(p: &Project) -> String {
    let mut pairs = vec![("name", p.name.clone()), ("created", p.created_at.clone())];
    if let Some(d) = &p.description {
        pairs.push(("description", d.clone()));
    }
    pairs.push((
        "capacity",
        quota_text(p.quotas.capacity_bytes, p.usage.capacity_bytes, true),
    ));
    pairs.push((
        "volumes",
        quota_text(p.quotas.volumes, p.usage.volumes, false),
    ));
    pairs.push((
        "snapshots",
        quota_text(p.quotas.snapshots, p.usage.snapshots, false),
    ));
    fields(&pairs)
}

fn token_fields(t: &Token) -> Vec<(&'static str, String)> {
    let mut pairs = vec![
        ("id", t.id.clone()),
        ("project", t.project.clone().unwrap_or_else(|| "-".into())),
        ("role", role_text(t)),
        ("created", t.created_at.clone()),
        ("expires", expiry_text(t)),
    ];
    if let Some(d) = &t.description {
        pairs.push(("description", d.clone()));
    }
    pairs
}

fn role_text(t: &Token) -> String {
    match (&t.project, t.role.as_str()) {
        (None, "admin") => "cluster-admin".into(),
        (_, role) => role.into(),
    }
}

fn expiry_text(t: &Token) -> String {
    match (&t.expires_at, t.expired) {
        (None, _) => "never".into(),
        (Some(at), true) => format!("{at} (expired)"),
        (Some(at), false) => at.clone(),
    }
}

fn type_fields(t: &VolumeType) -> String {
    let mut pairs = vec![("name", t.name.clone()), ("created", t.created_at.clone())];
    if let Some(d) = &t.description {
        pairs.push(("description", d.clone()));
    }
    pairs.push((
        "replicas",
        t.replicas
            .map_or_else(|| "cluster default".into(), |n| n.to_string()),
    ));
    pairs.push(("qos", qos_text(t)));
    pairs.push(("projects", projects_text(t)));
    pairs.push(("encrypted", if t.encrypted { "yes" } else { "no" }.into()));
    pairs.push((
        "compression",
        t.compression.clone().unwrap_or_else(|| "off".into()),
    ));
    pairs.push(("default", if t.is_default { "yes" } else { "no" }.into()));
    fields(&pairs)
}

fn qos_text(t: &VolumeType) -> String {
    if t.qos.is_empty() {
        "unlimited".into()
    } else {
        QosSpec(t.qos.clone()).to_text()
    }
}

fn projects_text(t: &VolumeType) -> String {
    if t.projects.is_empty() {
        "all".into()
    } else {
        t.projects.join(", ")
    }
}

pub fn run_project(command: ProjectCommand, client: &ClientArgs) -> Result<()> {
    let api = ApiClient::discover(client)?;
    let json_out = client.output == Output::Json;
    match command {
        ProjectCommand::Create {
            name,
            description,
            quotas,
        } => {
            let mut body = json!({"name": name, "quotas": quotas.to_json()?});
            if let Some(d) = description {
                body["description"] = json!(d);
            }
            let value = api.post("/api/v1/projects", body)?;
            if json_out {
                return print_json(&value);
            }
            let p: Project = decode(value)?;
            println!("created project {}", p.name);
            print!("{}", project_fields(&p));
        }
        ProjectCommand::List => {
            let value = api.get("/api/v1/projects")?;
            if json_out {
                return print_json(&value);
            }
            let list: ProjectList = decode(value)?;
            let rows: Vec<Vec<String>> = list
                .projects
                .iter()
                .map(|p| {
                    vec![
                        p.name.clone(),
                        quota_text(p.quotas.capacity_bytes, p.usage.capacity_bytes, true),
                        quota_text(p.quotas.volumes, p.usage.volumes, false),
                        quota_text(p.quotas.snapshots, p.usage.snapshots, false),
                        p.created_at.clone(),
                    ]
                })
                .collect();
            print!(
                "{}",
                table(
                    &[
                        ("NAME", Align::Left),
                        ("CAPACITY", Align::Left),
                        ("VOLUMES", Align::Left),
                        ("SNAPSHOTS", Align::Left),
                        ("CREATED", Align::Left),
                    ],
                    &rows
                )
            );
        }
        ProjectCommand::Show { name } => {
            let value = api.get(&project_path(&name))?;
            if json_out {
                return print_json(&value);
            }
            print!("{}", project_fields(&decode(value)?));
        }
        ProjectCommand::SetQuota { name, quotas } => {
            let body = quotas.to_json()?;
            if body.is_empty() {
                bail!("nothing to change: give --capacity, --volumes or --snapshots");
            }
            let value = api.put(
                &format!("{}/quotas", project_path(&name)),
                Value::Object(body),
            )?;
            if json_out {
                return print_json(&value);
            }
            let p: Project = decode(value)?;
            println!("quotas of project {} changed", p.name);
            print!("{}", project_fields(&p));
        }
        ProjectCommand::Delete { name } => {
            api.delete(&project_path(&name))?;
            if !json_out {
                println!("deleted project {name}");
            }
        }
    }
    Ok(())
}

pub fn run_token(command: TokenCommand, client: &ClientArgs) -> Result<()> {
    let api = ApiClient::discover(client)?;
    let json_out = client.output == Output::Json;
    match command {
        TokenCommand::Create {
            project,
            role,
            expires,
            description,
        } => {
            let role = match role {
                RoleArg::Admin => "admin",
                RoleArg::Member => "member",
            };
            let mut body = json!({ "role": role });
            if let Some(p) = project {
                body["project"] = json!(p);
            }
            if let Some(e) = expires {
                body["expires_in"] = json!(e);
            }
            if let Some(d) = description {
                body["description"] = json!(d);
            }
            let value = api.post("/api/v1/tokens", body)?;
            if json_out {
                return print_json(&value);
            }
            let created: CreatedToken = decode(value)?;
            println!("{}", created.token);
            eprintln!(
                "token {} created; the line above is shown only now (use it as --token or BASALT_TOKEN)",
                created.info.id
            );
            eprint!("{}", fields(&token_fields(&created.info)));
        }
        TokenCommand::List { project } => {
            let path = match &project {
                Some(p) => format!("/api/v1/tokens?project={}", path_segment(p)),
                None => "/api/v1/tokens".into(),
            };
            let value = api.get(&path)?;
            if json_out {
                return print_json(&value);
            }
            let list: TokenList = decode(value)?;
            let rows: Vec<Vec<String>> = list
                .tokens
                .iter()
                .map(|t| {
                    vec![
                        t.id.clone(),
                        t.project.clone().unwrap_or_else(|| "-".into()),
                        role_text(t),
                        expiry_text(t),
                        t.description.clone().unwrap_or_default(),
                    ]
                })
                .collect();
            print!(
                "{}",
                table(
                    &[
                        ("ID", Align::Left),
                        ("PROJECT", Align::Left),
                        ("ROLE", Align::Left),
                        ("EXPIRES", Align::Left),
                        ("DESCRIPTION", Align::Left),
                    ],
                    &rows
                )
            );
        }
        TokenCommand::Revoke { id } => {
            api.delete(&format!("/api/v1/tokens/{}", path_segment(&id)))?;
            if !json_out {
                println!("revoked token {id}");
            }
        }
    }
    Ok(())
}

pub fn run_type(command: TypeCommand, client: &ClientArgs) -> Result<()> {
    let api = ApiClient::discover(client)?;
    let json_out = client.output == Output::Json;
    match command {
        TypeCommand::Create {
            name,
            replicas,
            qos,
            projects,
            encrypted,
            compression,
            description,
            default,
        } => {
            let qos = match qos.as_deref() {
                None => QosSpec::default(),
                Some(text) => parse_qos(text)?,
            };
            let mut body = json!({ "name": name, "qos": qos.0, "projects": projects });
            if let Some(n) = replicas {
                body["replicas"] = json!(n);
            }
            if let Some(d) = description {
                body["description"] = json!(d);
            }
            if default {
                body["default"] = json!(true);
            }
            if encrypted {
                body["encrypted"] = json!(true);
            }
            if let Some(c) = &compression {
                body["compression"] = json!(c);
            }
            let value = api.post("/api/v1/types", body)?;
            if json_out {
                return print_json(&value);
            }
            let t: VolumeType = decode(value)?;
            println!("created volume type {}", t.name);
            print!("{}", type_fields(&t));
        }
        TypeCommand::List => {
            let value = api.get("/api/v1/types")?;
            if json_out {
                return print_json(&value);
            }
            let list: VolumeTypeList = decode(value)?;
            let rows: Vec<Vec<String>> = list
                .types
                .iter()
                .map(|t| {
                    vec![
                        format!("{}{}", t.name, if t.is_default { " (default)" } else { "" }),
                        t.replicas.map_or_else(|| "-".into(), |n| n.to_string()),
                        qos_text(t),
                        projects_text(t),
                    ]
                })
                .collect();
            print!(
                "{}",
                table(
                    &[
                        ("NAME", Align::Left),
                        ("REPLICAS", Align::Right),
                        ("QOS", Align::Left),
                        ("PROJECTS", Align::Left),
                    ],
                    &rows
                )
            );
        }
        TypeCommand::Show { name } => {
            let value = api.get(&format!("/api/v1/types/{}", path_segment(&name)))?;
            if json_out {
                return print_json(&value);
            }
            print!("{}", type_fields(&decode(value)?));
        }
        TypeCommand::Delete { name } => {
            api.delete(&format!("/api/v1/types/{}", path_segment(&name)))?;
            if !json_out {
                println!("deleted volume type {name}");
            }
        }
        TypeCommand::SetDefault { name } => {
            let value = if name == "none" {
                Value::Null
            } else {
                json!(name)
            };
            let answer = api.put("/api/v1/default-type", json!({ "name": value }))?;
            if json_out {
                return print_json(&answer);
            }
            match name.as_str() {
                "none" => println!("no default volume type"),
                name => println!("default volume type: {name}"),
            }
        }
    }
    Ok(())
}

pub fn run_nbd_key(command: NbdKeyCommand, client: &ClientArgs) -> Result<()> {
    let api = ApiClient::discover(client)?;
    let json_out = client.output == Output::Json;
    match command {
        NbdKeyCommand::Create {
            project,
            description,
        } => {
            let mut body = json!({});
            if let Some(p) = project {
                body["project"] = json!(p);
            }
            if let Some(d) = description {
                body["description"] = json!(d);
            }
            let value = api.post("/api/v1/nbd-keys", body)?;
            if json_out {
                return print_json(&value);
            }
            let created: CreatedNbdKey = decode(value)?;
            println!("{}", created.psk_line);
            eprintln!(
                "NBD key {} created; the line above is shown only now: put it in a keys.psk file (mode 0600) and connect with nbds://{}@HOST:PORT/VOLUME?tls-psk-file=keys.psk",
                created.info.identity, created.info.identity
            );
        }
        NbdKeyCommand::List => {
            let value = api.get("/api/v1/nbd-keys")?;
            if json_out {
                return print_json(&value);
            }
            let list: NbdKeyList = decode(value)?;
            let rows: Vec<Vec<String>> = list
                .keys
                .iter()
                .map(|k| {
                    vec![
                        k.identity.clone(),
                        k.project.clone().unwrap_or_else(|| "(all volumes)".into()),
                        k.created_at.clone(),
                        k.description.clone().unwrap_or_default(),
                    ]
                })
                .collect();
            print!(
                "{}",
                table(
                    &[
                        ("IDENTITY", Align::Left),
                        ("PROJECT", Align::Left),
                        ("CREATED", Align::Left),
                        ("DESCRIPTION", Align::Left),
                    ],
                    &rows
                )
            );
        }
        NbdKeyCommand::Revoke { identity } => {
            api.delete(&format!("/api/v1/nbd-keys/{}", path_segment(&identity)))?;
            if !json_out {
                println!("revoked NBD key {identity}");
            }
        }
    }
    Ok(())
}
