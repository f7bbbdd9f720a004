//! A checkpoint's chat template (Jinja, from GGUF `tokenizer.chat_template` or Hugging Face
//! `chat_template`) rendered with minijinja the way transformers renders it: trimmed and
//! left-stripped blocks, `messages`, `add_generation_prompt`, `bos_token` and `eos_token` in
//! the context, `raise_exception` and `strftime_now` as functions, and Python's string
//! methods (`.strip()`, `.startswith()`, ...) through minijinja-contrib's pycompat.

use minijinja::syntax::SyntaxConfig;
use minijinja::{context, Environment, Error, ErrorKind};

use crate::server::tokenize::ChatTurn;

/// A template that did not compile or refused a conversation.
#[derive(Debug, thiserror::Error)]
#[error("chat template: {0}")]
pub struct TemplateError(String);

fn describe(e: &Error) -> String {
    // The template's own message (raise_exception) without minijinja's decoration.
    match e.kind() {
        ErrorKind::InvalidOperation => e.detail().map_or_else(|| e.to_string(), str::to_string),
        _ => e.to_string(),
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles `source`; `bos` and `eos` are the special tokens' text.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        let mut syntax = SyntaxConfig::builder();
        syntax.trim_blocks(true).lstrip_blocks(true);
        env.set_syntax(syntax.build().map_err(|e| TemplateError(describe(&e)))?);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |fmt: String| -> String {
            strftime_utc(&fmt, now_unix())
        });
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| TemplateError(describe(&e)))?;
        Ok(ChatTemplate {
            env,
            bos: bos.to_string(),
            eos: eos.to_string(),
        })
    }

    /// The prompt for `messages`, ending where the assistant's reply begins.
    pub fn render(&self, messages: &[ChatTurn]) -> Result<String, TemplateError> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| TemplateError(describe(&e)))?;
        let messages: Vec<minijinja::Value> = messages
            .iter()
            .map(|m| context! { role => m.role.clone(), content => m.content.clone() })
            .collect();
        tmpl.render(context! {
            messages => messages,
            add_generation_prompt => true,
            bos_token => self.bos.clone(),
            eos_token => self.eos.clone(),
        })
        .map_err(|e| TemplateError(describe(&e)))
    }
}

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// (year, month 1..=12, day 1..=31) of a day count since 1970-01-01 (Hinnant's
/// `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// The subset of C's strftime that chat templates use (%d %m %Y %y %b %B %H %M %S %%), in
/// UTC; other directives are written as they are.
pub fn strftime_utc(fmt: &str, unix_s: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let (y, m, d) = civil_from_days(unix_s.div_euclid(86_400));
    let secs = unix_s.rem_euclid(86_400);
    let month = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('b') => out.push_str(&month[..3]),
            Some('B') => out.push_str(month),
            Some('H') => out.push_str(&format!("{:02}", secs / 3600)),
            Some('M') => out.push_str(&format!("{:02}", secs / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", secs % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turns(v: &[(&str, &str)]) -> Vec<ChatTurn> {
        v.iter()
            .map(|(r, c)| ChatTurn {
                role: r.to_string(),
                content: c.to_string(),
            })
            .collect()
    }

    /// SmolLM2-135M-Instruct's template, as its GGUF carries it.
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn smollm2_template_adds_its_default_system_turn_and_the_assistant_prompt() {
        let t = ChatTemplate::new(SMOLLM2, "<|im_start|>", "<|im_end|>").unwrap();
        let got = t
            .render(&turns(&[("user", "What is the capital of France?")]))
            .unwrap();
        assert_eq!(
            got,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging \
             Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n\
             <|im_start|>assistant\n"
        );
        let own = t
            .render(&turns(&[("system", "Be brief."), ("user", "Hi")]))
            .unwrap();
        assert!(
            own.starts_with("<|im_start|>system\nBe brief.<|im_end|>\n"),
            "{own}"
        );
    }

    /// Llama 3's template shape: bos_token, trimmed blocks, `.strip()`, raise_exception.
    const LLAMA3: &str = r#"{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{{- "Today Date: " + strftime_now("%d %b %Y") + "\n\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message.role not in ['user', 'assistant'] %}
        {{- raise_exception("Unknown role: " + message.role) }}
    {%- endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'].strip() + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"#;

    #[test]
    fn llama3_style_template_renders_with_bos_python_methods_and_the_date() {
        let t = ChatTemplate::new(LLAMA3, "<|begin_of_text|>", "<|eot_id|>").unwrap();
        // The date is read before and after, so a midnight between them cannot fail this.
        let before = strftime_utc("%d %b %Y", now_unix());
        let got = t
            .render(&turns(&[("system", " Be brief. "), ("user", "  Hi  ")]))
            .unwrap();
        let after = strftime_utc("%d %b %Y", now_unix());
        let want = |date: &str| {
            format!(
                "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nToday Date: \
                 {date}\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n\
                 Hi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
            )
        };
        assert!(got == want(&before) || got == want(&after), "{got}");
    }

    #[test]
    fn a_template_that_raises_is_an_error_with_its_message_and_bad_syntax_fails_early() {
        let t = ChatTemplate::new(LLAMA3, "", "").unwrap();
        let e = t.render(&turns(&[("tool", "x")])).unwrap_err().to_string();
        assert!(e.contains("Unknown role: tool"), "{e}");
        let e = ChatTemplate::new("{% for m in messages %}", "", "")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("chat template:"), "{e}");
    }

    #[test]
    fn strftime_formats_dates_in_utc() {
        // 2024-07-26 13:05:09 UTC.
        let t = 1_722_000_000 + 309;
        assert_eq!(strftime_utc("%d %b %Y", 1_721_952_000), "26 Jul 2024");
        assert_eq!(
            strftime_utc("%Y-%m-%d %H:%M:%S %B %y %% %q", t),
            "2024-07-26 13:25:09 July 24 % %q"
        );
        assert_eq!(strftime_utc("%d/%m/%Y", 0), "01/01/1970");
        assert_eq!(strftime_utc("%d %b %Y", 951_782_400), "29 Feb 2000");
    }
}
