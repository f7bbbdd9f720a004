//! YAML configuration (SPEC §10): one file, every field defaulted, unknown keys rejected, and
//! every error pointing at the field path and its line and column.
//!
//! Loading is parse (serde-saphyr, which positions syntax and schema errors) → validate
//! (pure, [`Config::validate`]) → position the broken rules by locating their keys in the
//! text ([`locate`]) → resolve derived defaults.

mod error;
pub mod locate;
mod schema;
mod validate;

pub use error::{ConfigError, Issue};
pub use locate::{KeyLocations, Position};
pub use schema::*;

use serde_saphyr::MessageFormatter;
use std::path::Path;

/// The embedded default configuration (`config/default.yaml`).
pub const DEFAULT_YAML: &str = include_str!("../../config/default.yaml");

const EMBEDDED_ORIGIN: &str = "<embedded config/default.yaml>";

impl Config {
    /// Parses, resolves and validates a YAML text. `origin` names the text in errors
    /// (usually the file path).
    pub fn from_yaml_str(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let cfg = parse(text, origin)?;
        // Validate before resolving, so a bad value is reported once, at the field written,
        // and not again through the defaults derived from it.
        let mut issues = validate::issues(&cfg);
        if !issues.is_empty() {
            let keys = KeyLocations::scan(text);
            issues.iter_mut().for_each(|i| i.locate(&keys));
            return Err(ConfigError::Invalid {
                origin: Some(origin.to_owned()),
                issues,
            });
        }
        Ok(cfg.resolved())
    }

    /// Reads, parses, resolves and validates a YAML file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_owned(),
            source,
        })?;
        Config::from_yaml_str(&text, &path.display().to_string())
    }

    /// The embedded default (`config/default.yaml`), resolved.
    pub fn embedded_default() -> Result<Config, ConfigError> {
        Config::from_yaml_str(DEFAULT_YAML, EMBEDDED_ORIGIN)
    }

    /// Every rule this config breaks, without positions (there is no text to point into).
    /// Pure. Configs from [`Config::from_yaml_str`] and [`Config::from_file`] already passed.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let issues = validate::issues(self);
        if issues.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid {
                origin: None,
                issues,
            })
        }
    }

    /// Fills the defaults that derive from other fields: `max_num_active_requests` from
    /// `max_batch_size`, and the model shape when neither shape nor path is given.
    pub fn resolve(&mut self) {
        self.max_num_active_requests
            .get_or_insert(self.max_batch_size);
        if self.model.shape.is_none() && self.model.path.is_none() {
            self.model.shape = Some(DEFAULT_MODEL_SHAPE.to_owned());
        }
    }

    /// This config with derived defaults filled in.
    pub fn resolved(mut self) -> Config {
        self.resolve();
        self
    }

    /// Admission slots: `max_num_active_requests`, or `max_batch_size` when unset.
    pub fn max_num_active_requests(&self) -> u32 {
        self.max_num_active_requests.unwrap_or(self.max_batch_size)
    }

    /// The preemption mode; an error when the two exclusive fields are both set or a value
    /// is out of range.
    pub fn preemption(&self) -> Result<Preemption, ConfigError> {
        validate::preemption_mode(self).map_err(|issue| ConfigError::Invalid {
            origin: None,
            issues: vec![issue],
        })
    }

    /// Where the weights come from. For a config that has both `shape` and `path` (which
    /// validation rejects) the path wins.
    pub fn model_source(&self) -> ModelSource {
        match (&self.model.path, &self.model.shape) {
            (Some(path), _) => ModelSource::Path(path.clone()),
            (None, shape) => ModelSource::Shape {
                name: shape.as_deref().unwrap_or(DEFAULT_MODEL_SHAPE).to_owned(),
                seed: self.model.seed,
            },
        }
    }

    /// The resolved config as YAML; [`Config::from_yaml_str`] reads it back equal.
    pub fn to_yaml(&self) -> Result<String, ConfigError> {
        let resolved = self.clone().resolved();
        serde_saphyr::to_string(&resolved).map_err(|e| ConfigError::Serialize(e.to_string()))
    }
}

/// `genslot check-config FILE`: loads and validates `path` and returns the resolved config
/// as YAML.
pub fn check_config(path: impl AsRef<Path>) -> Result<String, ConfigError> {
    Config::from_file(path)?.to_yaml()
}

fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
    // An empty file (or one with only comments) means "all defaults"; the deserializer
    // would call it an unexpected end of input.
    if KeyLocations::is_empty_document(text) {
        return Ok(Config::default());
    }
    serde_saphyr::from_str::<Config>(text).map_err(|e| {
        let e = e.without_snippet();
        let at = e.location().map(|l| Position {
            line: u32::try_from(l.line()).unwrap_or(u32::MAX),
            column: u32::try_from(l.column()).unwrap_or(u32::MAX),
        });
        let field = at.and_then(|p| KeyLocations::scan(text).path_at(p).map(str::to_owned));
        let message: String = serde_saphyr::UserMessageFormatter
            .format_message(e)
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        ConfigError::Parse {
            origin: origin.to_owned(),
            field,
            at,
            message,
        }
    })
}
