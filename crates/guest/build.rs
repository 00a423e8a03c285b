//! Builds the guest-forward relay (`relay/main.rs`, std only) into OUT_DIR.
//!
//! QEMU starts the relay for every guest connection to a forwarded address,
//! so it has to be an executable of its own; a `[[bin]]` target would not be
//! built for the crates that use this one as a dev-dependency, so the build
//! script compiles it with the same rustc and the library embeds its path.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=relay/main.rs");
    println!("cargo:rerun-if-changed=build.rs");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let target = env::var("TARGET").expect("cargo sets TARGET");
    let exe = out.join("basalt-guest-relay");
    let status = Command::new(&rustc)
        .args([
            "--edition",
            "2021",
            "--crate-type",
            "bin",
            "--crate-name",
            "basalt_guest_relay",
            "-C",
            "opt-level=2",
            "-C",
            "debuginfo=0",
            "--target",
            &target,
        ])
        .arg("-o")
        .arg(&exe)
        .arg("relay/main.rs")
        .status()
        .expect("run rustc for the relay");
    assert!(status.success(), "compiling relay/main.rs failed: {status}");
    println!("cargo:rustc-env=BASALT_GUEST_RELAY={}", exe.display());
}
