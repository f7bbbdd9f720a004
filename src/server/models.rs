//! The served model's names: the id clients see (`GET /v1/models`, every response's `model`)
//! and the aliases a request may use instead. Any other name is a 404 `model_not_found`.

use axum::http::StatusCode;

use super::error::ApiError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelNames {
    pub id: String,
    pub aliases: Vec<String>,
}

impl ModelNames {
    pub fn new(id: impl Into<String>) -> Self {
        ModelNames {
            id: id.into(),
            aliases: Vec::new(),
        }
    }

    pub fn with_aliases(mut self, aliases: Vec<String>) -> Self {
        self.aliases = aliases;
        self
    }

    /// A request's `model` (absent: the served model) → the served id.
    pub fn resolve(&self, requested: Option<&str>) -> Result<&str, ApiError> {
        match requested {
            None => Ok(&self.id),
            Some(m) if m == self.id || self.aliases.iter().any(|a| a == m) => Ok(&self.id),
            Some(m) => Err(ApiError {
                status: StatusCode::NOT_FOUND,
                message: format!(
                    "the model `{m}` does not exist; this server serves `{}`",
                    self.id
                ),
                param: Some("model".into()),
                code: "model_not_found",
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_and_aliases_resolve_and_anything_else_is_not_found() {
        let names = ModelNames::new("llama-8b").with_aliases(vec!["genslot".into()]);
        assert_eq!(names.resolve(None), Ok("llama-8b"));
        assert_eq!(names.resolve(Some("llama-8b")), Ok("llama-8b"));
        assert_eq!(names.resolve(Some("genslot")), Ok("llama-8b"));
        let e = names.resolve(Some("gpt-4")).unwrap_err();
        assert_eq!(
            (e.status, e.code),
            (StatusCode::NOT_FOUND, "model_not_found")
        );
    }
}
