//! The CLI's side of the REST API: finds the server (flags, environment or
//! the data directory's `server.json` and `api-token`), sends requests, and
//! turns every failure into one line that says what to do.

use crate::datadir::{DataDir, ServerInfo};
use anyhow::{anyhow, bail, Context, Result};
use basalt_api::types::ErrorBody;
use clap::{Args, ValueEnum};
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

/// How client commands reach the server; accepted after `volume`/`status`
/// or after the command itself.
#[derive(Args, Debug, Clone)]
pub struct ConnArgs {
    /// API base URL, e.g. http://127.0.0.1:8080 [default: from DIR/server.json]
    #[arg(long, global = true, env = "BASALT_URL", value_name = "URL")]
    pub url: Option<String>,

    /// API token [default: from DIR/api-token]
    #[arg(
        long,
        global = true,
        env = "BASALT_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,

    /// Output format.
    #[arg(long, short = 'o', global = true, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// Everything a client command needs to find and talk to the server.
#[derive(Debug, Clone)]
pub struct ClientArgs {
    /// The node's data directory, where `server.json` and `api-token` are.
    pub data_dir: PathBuf,
    pub url: Option<String>,
    pub token: Option<String>,
    pub output: Output,
}

impl ClientArgs {
    pub fn new(data_dir: PathBuf, conn: ConnArgs) -> Self {
        ClientArgs {
            data_dir,
            url: conn.url,
            token: conn.token,
            output: conn.output,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned columns with human sizes.
    Table,
    /// The API's JSON.
    Json,
}

/// A connection to one server's API.
pub struct ApiClient {
    base: String,
    token: String,
    agent: ureq::Agent,
    /// What `server.json` said, when the server was found through it.
    pub server: Option<ServerInfo>,
    /// Where the server was found, for error hints.
    origin: Origin,
}

enum Origin {
    Flag,
    DataDir(DataDir),
}

impl ApiClient {
    /// Resolves the server from flags, environment and data directory.
    pub fn discover(args: &ClientArgs) -> Result<ApiClient> {
        let data = DataDir::new(&args.data_dir);
        let (base, server, origin) = match &args.url {
            Some(url) => (url.clone(), data.read_server().ok().flatten(), Origin::Flag),
            None => {
                let server = data.read_server()?.ok_or_else(|| {
                    anyhow!(
                        "no basalt server is running on data directory {} (no server.json); \
                         start one with `basalt server --data-dir {} --capacity 20G`, or pass --url",
                        data.root().display(),
                        data.root().display()
                    )
                })?;
                (
                    server.api_url.clone(),
                    Some(server),
                    Origin::DataDir(data.clone()),
                )
            }
        };
        let token = match &args.token {
            Some(token) => token.clone(),
            None => data
                .read_token()
                .context("pass --token (or BASALT_TOKEN) or --data-dir")?,
        };
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(5))
            .timeout(Duration::from_secs(120))
            .build();
        Ok(ApiClient {
            base: base.trim_end_matches('/').to_string(),
            token,
            agent,
            server,
            origin,
        })
    }

    /// The API base URL (for `basalt bench`, which talks to the server itself).
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// The API token (for `basalt bench`).
    pub fn token(&self) -> &str {
        &self.token
    }

    pub fn get(&self, path: &str) -> Result<Value> {
        self.send("GET", path, None)
    }

    pub fn post(&self, path: &str, body: Value) -> Result<Value> {
        self.send("POST", path, Some(body))
    }

    pub fn put(&self, path: &str, body: Value) -> Result<Value> {
        self.send("PUT", path, Some(body))
    }

    /// A POST that may take up to `timeout` (instead of the usual 2
    /// minutes): an operation the server does in one request.
    pub fn post_long(&self, path: &str, body: Value, timeout: Duration) -> Result<Value> {
        self.send_with("POST", path, Some(body), Some(timeout))
    }

    pub fn delete(&self, path: &str) -> Result<Value> {
        self.send("DELETE", path, None)
    }

    /// Sends a request; returns the JSON body (`Null` for an empty one), or
    /// the server's error message.
    fn send(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value> {
        self.send_with(method, path, body, None)
    }

    fn send_with(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        timeout: Option<Duration>,
    ) -> Result<Value> {
        let url = format!("{}{path}", self.base);
        let mut request = self
            .agent
            .request(method, &url)
            .set("Authorization", &format!("Bearer {}", self.token));
        if let Some(timeout) = timeout {
            request = request.timeout(timeout);
        }
        let result = match body {
            Some(body) => request.send_json(body),
            None => request.call(),
        };
        let response = match result {
            Ok(response) => response,
            Err(ureq::Error::Status(code, response)) => {
                let text = response.into_string().unwrap_or_default();
                match serde_json::from_str::<ErrorBody>(&text) {
                    Ok(body) => bail!("{}", body.error),
                    Err(_) => bail!(
                        "the server answered {code} to {method} {path}: {}",
                        text.trim()
                    ),
                }
            }
            Err(ureq::Error::Transport(t)) => return Err(self.unreachable(&t)),
        };
        let text = response
            .into_string()
            .with_context(|| format!("cannot read the server's answer to {method} {path}"))?;
        if text.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&text)
            .with_context(|| format!("the server's answer to {method} {path} is not JSON"))
    }

    fn unreachable(&self, err: &ureq::Transport) -> anyhow::Error {
        let base = &self.base;
        match (&self.origin, &self.server) {
            (Origin::DataDir(data), Some(server)) if !process_alive(server.pid) => anyhow!(
                "the basalt server recorded in {} (pid {}) is not running; start it again with `basalt server --data-dir {}`",
                data.server_json().display(),
                server.pid,
                data.root().display()
            ),
            _ => anyhow!("cannot reach the basalt server at {base}: {err}; is `basalt server` running?"),
        }
    }
}

/// True if a process with this id exists (Linux: it has a /proc entry).
fn process_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}
