//! Why a config file could not be used: it could not be read, it is not the TOML
//! the sections allow (an unknown key, a wrong type, an old and a new name of one
//! key both set), or a value in it is refused ([`ConfigError`], which names the key).

use std::fmt;
use std::path::PathBuf;

use weir_backend::ConfigError;

/// A config file or value refused; `weir` prints it and exits before serving.
#[derive(Debug)]
pub enum Error {
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    Parse {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    Value(ConfigError),
}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Error {
        Error::Value(e)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Read { path, source } => {
                write!(f, "reading config file {}: {source}", path.display())
            }
            Error::Parse { path, source } => {
                write!(f, "parsing config file {}: {source}", path.display())
            }
            Error::Value(e) => write!(f, "config: {e}"),
        }
    }
}

/// The message already holds the cause (so `{:#}` prints it once); the cause itself
/// is in the variant's fields.
impl std::error::Error for Error {}
