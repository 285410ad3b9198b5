//! Standard output for every command: [`outln!`](crate::outln) writes one line and treats a
//! closed pipe (`minibroker demo | head -1`) as the reader being done, not as an error: the
//! line is dropped, [`stdout_closed`] turns true, and every later line is dropped too, so a
//! command ends quietly (a long-running one such as `consume --follow` stops when it sees the
//! flag) instead of panicking with "failed printing to stdout".
//!
//! Why not restore SIGPIPE's default action: the process would die at the write, skipping the
//! clean-up that `demo` and `dev` owe (temporary data directories, open transactions).

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

static CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes `args` and a newline to stdout; a closed pipe (or any write error) drops the line and
/// every later one.
pub fn write_line(args: std::fmt::Arguments<'_>) {
    if CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let mut out = std::io::stdout().lock();
    let written = out
        .write_fmt(args)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    if written.is_err() {
        CLOSED.store(true, Ordering::Relaxed);
    }
}

/// Whether stdout's reader went away (a write failed).
pub fn stdout_closed() -> bool {
    CLOSED.load(Ordering::Relaxed)
}

/// `println!` that ends quietly on a closed pipe (see [`crate::out`]).
#[macro_export]
macro_rules! outln {
    () => {
        $crate::out::write_line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::out::write_line(format_args!($($arg)*))
    };
}
