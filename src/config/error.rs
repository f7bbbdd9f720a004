//! Configuration errors. Every one names the field path and, when the config came from a
//! text, the line and column of that field.

use super::locate::{KeyLocations, Position};
use std::fmt;
use std::path::PathBuf;

/// One rule a configuration breaks.
#[derive(Debug, Clone, PartialEq)]
pub struct Issue {
    /// Dotted path of the field at fault, e.g. `scheduler_config.gen_preemption.tpot_budget`.
    pub field: String,
    pub message: String,
    /// Other fields the rule involves (e.g. the second of two exclusive fields).
    pub related: Vec<String>,
    /// Where `field` is written; `None` when it took its default or no text is known.
    pub at: Option<Position>,
    /// Where each of `related` is written, in the same order.
    pub related_at: Vec<Option<Position>>,
}

impl Issue {
    pub(crate) fn new(field: &str, message: impl Into<String>) -> Self {
        Issue {
            field: field.to_owned(),
            message: message.into(),
            related: Vec::new(),
            at: None,
            related_at: Vec::new(),
        }
    }

    pub(crate) fn with_related(mut self, field: &str) -> Self {
        self.related.push(field.to_owned());
        self.related_at.push(None);
        self
    }

    /// Fills positions from the text the config was parsed from. A field in `flags` (field,
    /// flag) was set on the command line: the text's value is not the one checked, so the
    /// message names the flag instead of pointing into the text.
    pub(crate) fn locate(&mut self, keys: &KeyLocations, flags: &[(&str, &str)]) {
        let flag = |field: &str| {
            flags
                .iter()
                .find(|(f, _)| *f == field)
                .map(|&(_, flag)| flag.to_owned())
        };
        let at = |field: &str| flag(field).map_or_else(|| keys.get(field), |_| None);
        self.at = at(&self.field);
        self.related_at = self.related.iter().map(|f| at(f)).collect();
        for field in std::iter::once(&self.field).chain(&self.related) {
            if let Some(flag) = flag(field) {
                self.message += &format!(" [{field} from {flag}]");
            }
        }
    }

    /// Where to point the reader: the field itself, else the first related field written.
    pub fn primary_position(&self) -> Option<Position> {
        self.at
            .or_else(|| self.related_at.iter().flatten().next().copied())
    }
}

impl fmt::Display for Issue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The caller prefixes the position; a field that is not written holds its default.
        write!(f, "{}", self.field)?;
        if self.at.is_none() && self.related_at.iter().any(Option::is_some) {
            write!(f, " (default)")?;
        }
        write!(f, ": {}", self.message)?;
        let placed: Vec<String> = self
            .related
            .iter()
            .zip(&self.related_at)
            .filter_map(|(r, p)| p.map(|p| format!("{r} at {p}")))
            .collect();
        if !placed.is_empty() {
            write!(f, " [see {}]", placed.join("; "))?;
        }
        Ok(())
    }
}

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    // The cause is in the message and not a source (thiserror makes a field named `source`
    // one), so a printed error chain names it once.
    #[error("{}: cannot read config: {cause}", path.display())]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    /// The YAML is malformed or does not fit the schema (unknown field, wrong type, bad
    /// enum value). Positions come from the YAML parser.
    #[error("{}", fmt_parse(origin, field.as_deref(), *at, message))]
    Parse {
        origin: String,
        /// The field the error sits in, when it could be told from the position.
        field: Option<String>,
        at: Option<Position>,
        message: String,
    },
    /// The YAML parsed but breaks one or more rules; all are listed.
    #[error("{}", fmt_invalid(origin.as_deref(), issues))]
    Invalid {
        /// File name or other label of the text; `None` for a config built in code.
        origin: Option<String>,
        issues: Vec<Issue>,
    },
    #[error("cannot write config as YAML: {0}")]
    Serialize(String),
}

impl ConfigError {
    /// The rules broken, empty for I/O, parse and serialization errors.
    pub fn issues(&self) -> &[Issue] {
        match self {
            ConfigError::Invalid { issues, .. } => issues,
            _ => &[],
        }
    }
}

fn fmt_parse(origin: &str, field: Option<&str>, at: Option<Position>, message: &str) -> String {
    let place = match at {
        Some(p) => format!("{origin}:{}:{}", p.line, p.column),
        None => origin.to_owned(),
    };
    match field {
        Some(field) => format!("{place}: {field}: {message}"),
        None => format!("{place}: {message}"),
    }
}

/// `origin:line:col: warning: field: message`.
pub fn fmt_warning(origin: &str, issue: &Issue) -> String {
    match issue.primary_position() {
        Some(p) => format!("{origin}:{}:{}: warning: {issue}", p.line, p.column),
        None => format!("{origin}: warning: {issue}"),
    }
}

fn fmt_invalid(origin: Option<&str>, issues: &[Issue]) -> String {
    let lines: Vec<String> = issues
        .iter()
        .map(|i| {
            let place = match (origin, i.primary_position()) {
                (Some(o), Some(p)) => format!("{o}:{}:{}: ", p.line, p.column),
                (Some(o), None) => format!("{o}: "),
                (None, _) => String::new(),
            };
            format!("{place}{i}")
        })
        .collect();
    let head = if issues.len() == 1 {
        "invalid config".to_owned()
    } else {
        format!("invalid config ({} problems)", issues.len())
    };
    format!("{head}:\n  {}", lines.join("\n  "))
}
