//! basalt-guest-relay: carries one guest TCP connection to a host address.
//!
//! QEMU's user-mode network (libslirp) runs this program for every
//! connection the guest opens to a `guestfwd=...-cmd:` address, with its
//! stdin, stdout and stderr all being slirp's end of that connection (a
//! loopback TCP socket pair). The relay connects to the host address given
//! as its only argument and copies bytes both ways.
//!
//! Invariants (both measured: without either one, every 4 KiB write of the
//! guest's NBD client waits ~40 ms, 21 IOPS at queue depth 1 instead of
//! ~590, as with socat, `nodelay` or not):
//! - The host socket has TCP_NODELAY: a request arrives from slirp in
//!   segment-sized pieces, and Nagle would hold each piece after the first
//!   until the server's delayed ACK.
//! - Before every read of the guest side the relay re-arms TCP_QUICKACK on
//!   it: slirp's end of its socket pair has Nagle on (slirp does not set
//!   TCP_NODELAY there) and writes each guest segment separately, so the
//!   last piece of a request waits for our ACK, which Linux would delay.
//!   (TCP_NODELAY is set on our end too, for the replies.)
//! - Nothing but relayed bytes is ever written to fds 0-2: stderr is the
//!   guest's connection too. Failures are reported by the exit status only
//!   (the guest sees its connection closed).
//! - The relay exits when the host side closes (or fails), after passing
//!   the close on to the guest; it also exits when slirp's end goes away
//!   (QEMU exited), because every read or write on it then fails.
//!
//! Built by the basalt-guest crate's build script (std only, no crates);
//! the library passes its path to QEMU.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd};
use std::process::ExitCode;
use std::thread;

/// Large enough that one read carries a whole NBD or NVMe/TCP data PDU.
const BUF: usize = 256 * 1024;

fn main() -> ExitCode {
    // A panic message would go to stderr, i.e. into the guest's stream.
    std::panic::set_hook(Box::new(|_| {}));
    let mut args = std::env::args().skip(1);
    let (Some(addr), None) = (args.next(), args.next()) else {
        return ExitCode::from(2);
    };
    // SAFETY: slirp hands us its connection as fd 0 (and 1 and 2); this
    // process owns it from here on, and nothing else in it uses fd 0.
    let guest = unsafe { TcpStream::from_raw_fd(0) };
    // On a non-TCP socket this fails harmlessly (nothing to tune).
    let _ = guest.set_nodelay(true);
    let host = match TcpStream::connect(addr.as_str()) {
        Ok(s) => s,
        Err(_) => return ExitCode::from(1),
    };
    if host.set_nodelay(true).is_err() {
        return ExitCode::from(1);
    }
    let (Ok(guest_rx), Ok(host_tx)) = (guest.try_clone(), host.try_clone()) else {
        return ExitCode::from(1);
    };
    // guest -> host on a second thread; host -> guest here, and its end is
    // the relay's end.
    thread::spawn(move || pump(guest_rx, host_tx, true));
    pump(host, guest, false);
    ExitCode::SUCCESS
}

extern "C" {
    fn setsockopt(fd: i32, level: i32, name: i32, value: *const std::ffi::c_void, len: u32) -> i32;
}

/// Linux `IPPROTO_TCP` and `TCP_QUICKACK`.
const IPPROTO_TCP: i32 = 6;
const TCP_QUICKACK: i32 = 12;

/// Asks the kernel to ACK what arrives on `s` at once (it falls back to
/// delayed ACKs by itself, hence before every read). Fails harmlessly on a
/// socket that is not TCP.
fn quickack(s: &TcpStream) {
    let one: i32 = 1;
    // SAFETY: setsockopt(2) on a descriptor `s` owns, with a pointer to a
    // live i32 and its size.
    unsafe {
        setsockopt(
            s.as_raw_fd(),
            IPPROTO_TCP,
            TCP_QUICKACK,
            (&one as *const i32).cast(),
            std::mem::size_of::<i32>() as u32,
        );
    }
}

/// Copies `from` to `to` until `from` ends or either fails, then passes the
/// end on (shutdown of `to`'s write side). With `ack_now`, every read is
/// preceded by [`quickack`].
fn pump(mut from: TcpStream, mut to: TcpStream, ack_now: bool) {
    let mut buf = vec![0u8; BUF];
    loop {
        if ack_now {
            quickack(&from);
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
