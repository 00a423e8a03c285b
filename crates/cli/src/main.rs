//! `basalt`: the one binary of Basalt. `basalt server` runs a node;
//! `basalt volume …`, `basalt snapshot …`, `basalt project …`, `basalt
//! token …`, `basalt type …` and `basalt status` manage one over its REST
//! API;
//! `basalt bench …` measures it (and its peers) with fio; `basalt store …`
//! works on a stopped node's store.
//!
//! Exit status: 0 on success, 1 on an error (printed as one `error: …` line
//! on stderr), 2 on a usage error.

mod bench;
mod client;
mod commands;
mod datadir;
mod diffs;
mod exports;
mod images;
mod iscsi_targets;
mod output;
mod server;
mod snapshots;
mod store_cmd;
mod subsystems;
mod tenancy;
mod transfer;
mod windows;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use client::ClientArgs;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use tracing_subscriber::EnvFilter;

#[derive(Parser, Debug)]
#[command(
    name = "basalt",
    version,
    about = "Basalt block storage: run a node, manage its volumes",
    after_help = "Start a node:   basalt server --data-dir ./basalt-data --capacity 20G --demo-volume demo:10G\n\
                  Then:           basalt volume list        (finds the server through ./basalt-data)"
)]
struct Cli {
    /// Log filter: error, warn, info, debug, trace or a RUST_LOG-style
    /// directive [default: $RUST_LOG, else info for the server, warn otherwise]
    #[arg(long, global = true, value_name = "FILTER", value_parser = parse_filter)]
    log_level: Option<String>,

    /// The node's data directory (the server keeps its files there; client
    /// commands read its server.json and api-token)
    #[arg(
        long,
        global = true,
        env = "BASALT_DATA_DIR",
        default_value = "./basalt-data",
        value_name = "DIR"
    )]
    data_dir: PathBuf,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a node: control plane, store and NBD frontend in one process.
    Server(Box<server::ServerArgs>),
    /// Manage volumes.
    Volume(VolumeArgs),
    /// Manage snapshots of volumes (VOLUME@SNAPSHOT).
    Snapshot(SnapshotArgs),
    /// Manage projects (tenants) and their quotas.
    Project(ProjectArgs),
    /// Manage API tokens (per project, with a role).
    Token(TokenArgs),
    /// Manage pre-shared keys for NBD over TLS.
    #[command(name = "nbd-key")]
    NbdKey(NbdKeyArgs),
    /// Manage volume types (replica count and QoS bundles).
    Type(TypeArgs),
    /// Show the node's capacity, provisioning and allocation.
    Status(client::ConnArgs),
    /// Manage the nodes of a cluster.
    Node(NodeArgs),
    /// Manage the master key of encrypted volumes.
    Key(KeyArgs),
    /// Benchmark Basalt and its peers with the published fio methodologies.
    Bench(bench::BenchArgs),
    /// Offline operations on this node's store (no server running).
    Store {
        #[command(subcommand)]
        command: store_cmd::StoreCommand,
    },
}

#[derive(clap::Args, Debug)]
struct VolumeArgs {
    #[command(flatten)]
    conn: client::ConnArgs,
    #[command(subcommand)]
    command: commands::VolumeCommand,
}

#[derive(clap::Args, Debug)]
struct SnapshotArgs {
    #[command(flatten)]
    conn: client::ConnArgs,
    #[command(subcommand)]
    command: snapshots::SnapshotCommand,
}

#[derive(clap::Args, Debug)]
struct ProjectArgs {
    #[command(flatten)]
    conn: client::ConnArgs,
    #[command(subcommand)]
    command: tenancy::ProjectCommand,
}

#[derive(clap::Args, Debug)]
struct TokenArgs {
    #[command(flatten)]
    conn: client::ConnArgs,
    #[command(subcommand)]
    command: tenancy::TokenCommand,
}

#[derive(clap::Args, Debug)]
struct NbdKeyArgs {
    #[command(flatten)]
    conn: client::ConnArgs,
    #[command(subcommand)]
    command: tenancy::NbdKeyCommand,
}

#[derive(clap::Args, Debug)]
struct TypeArgs {
    #[command(flatten)]
    conn: client::ConnArgs,
    #[command(subcommand)]
    command: tenancy::TypeCommand,
}

#[derive(clap::Args, Debug)]
struct KeyArgs {
    #[command(flatten)]
    conn: client::ConnArgs,
    #[command(subcommand)]
    command: commands::KeyCommand,
}

#[derive(clap::Args, Debug)]
struct NodeArgs {
    #[command(flatten)]
    conn: client::ConnArgs,
    #[command(subcommand)]
    command: commands::NodeCommand,
}

fn parse_filter(s: &str) -> Result<String, String> {
    EnvFilter::try_new(s)
        .map(|_| s.to_string())
        .map_err(|e| format!("invalid log filter {s:?}: {e}"))
}

fn init_logging(flag: Option<&str>, default: &str) {
    let filter = match flag {
        Some(directive) => EnvFilter::new(directive),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default)),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // `basalt bench` uses a running server only when pointed at one.
    let data_dir_given = matches!(
        matches.value_source("data_dir"),
        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
    );
    let default_level = match cli.command {
        Command::Server(_) => "info",
        _ => "warn",
    };
    init_logging(cli.log_level.as_deref(), default_level);
    let result = match cli.command {
        Command::Server(args) => server::run(*args, &cli.data_dir),
        Command::Volume(VolumeArgs { conn, command }) => {
            commands::run_volume(command, &ClientArgs::new(cli.data_dir, conn))
        }
        Command::Snapshot(SnapshotArgs { conn, command }) => {
            snapshots::run_snapshot(command, &ClientArgs::new(cli.data_dir, conn))
        }
        Command::Project(ProjectArgs { conn, command }) => {
            tenancy::run_project(command, &ClientArgs::new(cli.data_dir, conn))
        }
        Command::Token(TokenArgs { conn, command }) => {
            tenancy::run_token(command, &ClientArgs::new(cli.data_dir, conn))
        }
        Command::NbdKey(NbdKeyArgs { conn, command }) => {
            tenancy::run_nbd_key(command, &ClientArgs::new(cli.data_dir, conn))
        }
        Command::Type(TypeArgs { conn, command }) => {
            tenancy::run_type(command, &ClientArgs::new(cli.data_dir, conn))
        }
        Command::Status(conn) => commands::run_status(&ClientArgs::new(cli.data_dir, conn)),
        Command::Node(NodeArgs { conn, command }) => {
            commands::run_node(command, &ClientArgs::new(cli.data_dir, conn))
        }
        Command::Key(KeyArgs { conn, command }) => {
            commands::run_key(command, &ClientArgs::new(cli.data_dir, conn))
        }
        Command::Bench(args) => bench::run(args, &cli.data_dir, data_dir_given),
        Command::Store { command } => store_cmd::run(command, &cli.data_dir),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
