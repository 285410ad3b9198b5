//! Logging set-up shared by every binary: `tracing` to **stderr** (stdout is for a command's
//! output), filtered by `RUST_LOG`, as human-readable text or one JSON object per line
//! (`--log-format json`, env `LOG_FORMAT`), for a log shipper.
//!
//! Levels, the same on every node: state changes an operator acts on (a new producer id, an
//! instance fenced, a transaction timed out, a partition offline) at info with structured
//! fields (`txn_id`, `pid`, `epoch`, `cause`); what every transaction or request does at debug.

use std::fmt;
use std::str::FromStr;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per event (fields flattened, with timestamp, level and target).
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(format!("unknown log format {other:?}: text or json")),
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Text => "text",
            Self::Json => "json",
        })
    }
}

/// Installs the global subscriber: stderr, `RUST_LOG` (else `default_filter`), in `format`.
/// A second call (a test that already installed one) changes nothing.
pub fn init(format: LogFormat, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse() {
        assert_eq!("json".parse::<LogFormat>(), Ok(LogFormat::Json));
        assert_eq!("TEXT".parse::<LogFormat>(), Ok(LogFormat::Text));
        assert!("xml".parse::<LogFormat>().is_err());
    }
}
