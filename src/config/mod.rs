//! YAML configuration (SPEC §10): one file, every field defaulted, unknown keys rejected, and
//! every error pointing at the field path and its line and column.
//!
//! Loading is parse (serde-saphyr, which positions syntax and schema errors) → validate
//! (pure, [`Config::validate`]) → position the broken rules by locating their keys in the
//! text ([`locate`]) → resolve derived defaults.

mod effect;
mod error;
pub mod host;
pub mod locate;
pub mod rule;
mod schema;
mod validate;

pub use error::{fmt_warning, ConfigError, Issue};
pub use host::Host;
pub use locate::{KeyLocations, Position};
pub use schema::*;
pub use validate::{
    MAX_BODY_BYTES, MAX_CONNECTIONS, MAX_CONTEXT_TOKENS, MAX_ENTRIES, MAX_KV_PAGES,
    MAX_PASS_TOKENS, MAX_ROWS, MAX_SECONDS, MAX_TIMING_UNIT,
};

use serde_saphyr::MessageFormatter;
use std::path::Path;

/// The embedded default configuration (`config/default.yaml`).
pub const DEFAULT_YAML: &str = include_str!("../../config/default.yaml");

pub const EMBEDDED_ORIGIN: &str = "<embedded config/default.yaml>";

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
            issues.iter_mut().for_each(|i| i.locate(&keys, &[]));
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
        let text = read(path)?;
        Config::from_yaml_str(&text, &path.display().to_string())
    }

    /// The embedded default (`config/default.yaml`), resolved.
    pub fn embedded_default() -> Result<Config, ConfigError> {
        Config::from_yaml_str(DEFAULT_YAML, EMBEDDED_ORIGIN)
    }

    /// The checks for serving this config on this machine, after command-line overrides:
    /// every rule again (an override may break one), the host's memory against what the
    /// config sizes, and the model path where the backend reads it. `text` is the YAML the
    /// config came from (for positions); `flags` names the fields set on the command line
    /// (field, flag), which an issue names instead of pointing into the text. Returns the
    /// warnings: fields set that change nothing on the chosen backend, positioned.
    pub fn check_for_serving(
        &self,
        text: &str,
        origin: &str,
        host: &Host,
        flags: &[(&str, &str)],
    ) -> Result<Vec<Issue>, ConfigError> {
        let keys = KeyLocations::scan(text);
        let mut issues = validate::issues(self);
        issues.extend(host::issues(self, host));
        if !issues.is_empty() {
            issues.iter_mut().for_each(|i| i.locate(&keys, flags));
            return Err(ConfigError::Invalid {
                origin: Some(origin.to_owned()),
                issues,
            });
        }
        let mut warnings = effect::warnings(self);
        warnings.iter_mut().for_each(|i| i.locate(&keys, flags));
        Ok(warnings)
    }

    /// The model id clients see: `server.served_model_name`, else the shape's name or the
    /// checkpoint path as written.
    pub fn served_model_name(&self) -> String {
        if let Some(name) = &self.server.served_model_name {
            return name.clone();
        }
        match self.model_source() {
            ModelSource::Shape { name, .. } => name,
            ModelSource::Path(p) => p.display().to_string(),
        }
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
    /// `max_batch_size`, `tpot_budget`'s `initial_gain` and `gain_from`, and the model shape when neither
    /// shape nor path is given.
    pub fn resolve(&mut self) {
        self.max_num_active_requests
            .get_or_insert(self.max_batch_size);
        let p = &mut self.scheduler_config.gen_preemption;
        if p.tpot_budget.is_some() {
            p.initial_gain
                .get_or_insert(crate::policy::preemption::controller::G_START);
            p.gain_from.get_or_insert(GainFrom::Any);
        }
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

    /// The admission queue's parameters (SPEC §4.2), as the server and `sim --config` run it.
    pub fn admission(&self) -> crate::policy::AdmissionParams {
        let a = &self.scheduler_config.gen_admission;
        crate::policy::AdmissionParams {
            policy: a.policy,
            ttft_percentile: a.ttft_percentile,
            target_window: a.target_window as usize,
            min_samples: a.min_samples as usize,
            max_waiting: a.max_waiting as usize,
            fixed_target: None,
        }
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

/// What `genslot check-config` found in a valid file.
#[derive(Debug)]
pub struct Checked {
    /// The resolved config as YAML.
    pub yaml: String,
    /// One line per field that changes nothing on the chosen backend, with its position.
    pub warnings: Vec<String>,
}

/// `genslot check-config FILE`: loads and validates `path`, checks it against `host`, and
/// returns the resolved config as YAML with the warnings.
pub fn check_config(path: impl AsRef<Path>, host: &Host) -> Result<Checked, ConfigError> {
    let path = path.as_ref();
    let text = read(path)?;
    let origin = path.display().to_string();
    let cfg = Config::from_yaml_str(&text, &origin)?;
    let warnings = cfg.check_for_serving(&text, &origin, host, &[])?;
    Ok(Checked {
        yaml: cfg.to_yaml()?,
        warnings: warnings
            .iter()
            .map(|w| error::fmt_warning(&origin, w))
            .collect(),
    })
}

/// What the parser read at an error's position, for its message.
fn read_as(v: &locate::ScalarAt) -> String {
    let mut shown: String = v.value.chars().take(60).collect();
    if shown.len() < v.value.len() {
        shown.push('…');
    }
    if v.last_line > v.first_line {
        format!(
            " (read `{shown}`, a value that runs on to line {}: is that line indented too far?)",
            v.last_line
        )
    } else {
        format!(" (read `{shown}`)")
    }
}

/// The text of a config file.
pub fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|cause| ConfigError::Io {
        path: path.to_owned(),
        cause,
    })
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
        let mut message: String = serde_saphyr::UserMessageFormatter
            .format_message(e)
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        if let Some(value) = at.and_then(|p| locate::scalar_at(text, p)) {
            if value.last_line > value.first_line || !message.contains(&value.value) {
                message.push_str(&read_as(&value));
            }
        }
        ConfigError::Parse {
            origin: origin.to_owned(),
            field,
            at,
            message,
        }
    })
}

#[cfg(test)]
mod default_file_tests {
    use super::*;

    /// `config/default.yaml` is where a user reads what can be set: it writes every field
    /// the resolved default prints, or shows it in a comment (`# field:`) where its default
    /// derives from another.
    #[test]
    fn the_default_file_writes_every_field() {
        let printed = Config::default().resolved().to_yaml().expect("prints");
        let written = KeyLocations::scan(DEFAULT_YAML);
        let commented = |path: &str| {
            let name = path.rsplit('.').next().unwrap_or(path);
            DEFAULT_YAML.contains(&format!("# {name}:"))
        };
        let printed = KeyLocations::scan(&printed);
        let missing: Vec<&str> = printed
            .paths()
            .filter(|p| written.get(p).is_none() && !commented(p))
            .collect();
        assert!(
            missing.is_empty(),
            "not in config/default.yaml: {missing:?}"
        );
    }
}
