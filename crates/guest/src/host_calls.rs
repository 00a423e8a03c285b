//! Requests from a guest's script to the test on the host, while the
//! script runs: the test starts a [`HostCalls`] listener with a handler,
//! forwards a guest port to it ([`HostCalls::forward`]) and puts
//! [`HostCalls::shell_function`] into its script; the script then runs
//! `host_call resize 384M` and continues once the host has done it (e.g.
//! resized a volume the guest has attached, so the script can watch the
//! guest notice).
//!
//! Protocol (one request per TCP connection): the guest sends one line of
//! at most [`MAX_REQUEST`] bytes; the host answers one line, `ok TEXT` or
//! `error TEXT`, and closes the connection. Busybox `nc` speaks it:
//! `echo WORDS | nc IP PORT`.
//!
//! Invariants:
//! - Requests are handled one at a time, in arrival order, on the
//!   listener's own thread; every request and its answer are recorded
//!   ([`HostCalls::calls`]).
//! - A connection that sends no complete line within [`REQUEST_TIMEOUT`]
//!   is answered `error` and closed; it never blocks later requests for
//!   longer.
//! - Dropping the [`HostCalls`] stops the listener and joins its thread.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::forward::{Forward, FORWARD_IP};

/// Longest request line accepted.
pub const MAX_REQUEST: u64 = 4096;
/// Time a guest has to send its request line.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A request the guest made and what the handler answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub request: String,
    pub answer: Result<String, String>,
}

/// A listener on 127.0.0.1 that answers the guest's `host_call`s.
pub struct HostCalls {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    calls: Arc<Mutex<Vec<Call>>>,
    thread: Option<JoinHandle<()>>,
}

impl HostCalls {
    /// Starts listening; `handler` gets each request line (trimmed) and
    /// returns the text of an `ok` or an `error` answer.
    pub fn start<F>(handler: F) -> io::Result<HostCalls>
    where
        F: FnMut(&str) -> Result<String, String> + Send + 'static,
    {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(Mutex::new(Vec::new()));
        let thread = std::thread::Builder::new()
            .name("guest-host-calls".into())
            .spawn({
                let stop = Arc::clone(&stop);
                let calls = Arc::clone(&calls);
                move || serve(&listener, &stop, &calls, handler)
            })?;
        Ok(HostCalls {
            addr,
            stop,
            calls,
            thread: Some(thread),
        })
    }

    /// The host address the guest's requests must reach.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The forward that makes `FORWARD_IP:guest_port` reach this listener.
    pub fn forward(&self, guest_port: u16) -> Forward {
        Forward::new(guest_port, self.addr)
    }

    /// The requests handled so far.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A shell function `host_call WORDS...` for the guest's script: sends
    /// the words to the listener forwarded at `FORWARD_IP:guest_port`,
    /// prints the answer and fails unless it is `ok`.
    pub fn shell_function(guest_port: u16) -> String {
        format!(
            r#"host_call() {{
    answer=$(echo "$*" | nc {FORWARD_IP} {guest_port}) || return 1
    echo "host_call $*: $answer"
    case "$answer" in ok*) return 0 ;; *) return 1 ;; esac
}}
"#
        )
    }
}

impl Drop for HostCalls {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocked accept().
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve<F>(listener: &TcpListener, stop: &AtomicBool, calls: &Mutex<Vec<Call>>, mut handler: F)
where
    F: FnMut(&str) -> Result<String, String>,
{
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = conn else { continue };
        let request = match read_request(&stream) {
            Ok(r) => r,
            Err(e) => {
                let _ = (&stream).write_all(format!("error bad request: {e}\n").as_bytes());
                continue;
            }
        };
        let answer = handler(&request);
        let line = match &answer {
            Ok(text) => format!("ok {}\n", one_line(text)),
            Err(text) => format!("error {}\n", one_line(text)),
        };
        let _ = (&stream).write_all(line.as_bytes());
        calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Call { request, answer });
    }
}

fn read_request(stream: &TcpStream) -> io::Result<String> {
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    let mut line = String::new();
    BufReader::new(stream.take(MAX_REQUEST)).read_line(&mut line)?;
    if !line.ends_with('\n') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "no complete request line",
        ));
    }
    Ok(line.trim().to_string())
}

fn one_line(text: &str) -> String {
    text.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(request).unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        answer
    }

    #[test]
    fn answers_each_request_and_records_it() {
        let calls = HostCalls::start(|req| match req {
            "double 21" => Ok("42".into()),
            other => Err(format!("unknown request {other:?}\nsecond line")),
        })
        .unwrap();
        assert_eq!(call(calls.addr(), b"double 21\n"), "ok 42\n");
        assert_eq!(
            call(calls.addr(), b"nope\n"),
            "error unknown request \"nope\" second line\n"
        );
        // A request without its newline is refused, not handled.
        let mut s = TcpStream::connect(calls.addr()).unwrap();
        s.write_all(b"double 21").unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("error bad request"), "{answer}");
        let got = calls.calls();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].request, "double 21");
        assert_eq!(got[0].answer, Ok("42".into()));
        assert!(got[1].answer.is_err());
    }

    #[test]
    fn shell_function_uses_the_forward_address() {
        let f = HostCalls::shell_function(7000);
        assert!(f.contains("nc 10.0.2.100 7000"), "{f}");
        assert!(f.starts_with("host_call() {"), "{f}");
    }
}
