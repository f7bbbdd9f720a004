//! The GPT-2 byte-level BPE tokenizer a GGUF file describes (`tokenizer.ggml.model =
//! "gpt2"`), enough to encode chat prompts and decode generations: control tokens matched
//! whole, the SmolLM digit split, the GPT-2 pre-tokenizer regex written out by hand, the
//! byte-to-character alphabet and rank-ordered merges. It matches Hugging Face
//! `tokenizers` configured as in the notes' GGUF -> tokenizer.json recipe; letters are
//! `char::is_alphabetic`, a superset of the regex's `\p{L}` that differs only on combining
//! marks and letter-numbers.

use std::collections::HashMap;

use super::reader::{Gguf, GgufError};

/// GGUF token types that are matched whole in text (llama.cpp: CONTROL, USER_DEFINED).
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("{path}: {msg}")]
    Vocab { path: String, msg: String },
    #[error("no token for {0:?} (the vocabulary lacks a byte symbol)")]
    NoToken(String),
    #[error("token id {0} is outside the vocabulary")]
    BadId(u32),
}

/// Pre-tokenisation before the GPT-2 regex.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizer {
    /// The regex alone (`tokenizer.ggml.pre = "gpt-2"`).
    Gpt2,
    /// Every digit on its own first (`"smollm"`).
    Gpt2IndividualDigits,
}

pub struct BpeTokenizer {
    tokens: Vec<String>,
    ids: HashMap<String, u32>,
    /// (left, right) -> (rank, merged id).
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// Tokens matched whole in text, longest first.
    specials: Vec<(String, u32)>,
    is_special: Vec<bool>,
    pre: PreTokenizer,
    byte_char: [char; 256],
    char_byte: HashMap<char, u8>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
}

impl BpeTokenizer {
    /// Reads `tokenizer.ggml.{model,pre,tokens,token_type,merges,bos_token_id,eos_token_id}`.
    pub fn from_gguf(g: &Gguf) -> Result<Self, TokenizerError> {
        let bad = |msg: String| TokenizerError::Vocab {
            path: g.path().into(),
            msg,
        };
        let model = g.meta_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(bad(format!(
                "tokenizer model {model:?} is not supported (only gpt2 byte-level BPE)"
            )));
        }
        let pre = match g.get("tokenizer.ggml.pre").and_then(|v| v.as_str()) {
            None | Some("gpt-2") | Some("default") => PreTokenizer::Gpt2,
            Some("smollm") => PreTokenizer::Gpt2IndividualDigits,
            Some(other) => return Err(bad(format!("pre-tokenizer {other:?} is not supported"))),
        };
        let tokens = g.meta_strings("tokenizer.ggml.tokens")?;
        let merges = g.meta_strings("tokenizer.ggml.merges")?;
        let types = match g.get("tokenizer.ggml.token_type") {
            Some(_) => g.meta_ints("tokenizer.ggml.token_type")?,
            None => vec![1; tokens.len()],
        };
        if types.len() != tokens.len() {
            return Err(bad(format!(
                "{} token types for {} tokens",
                types.len(),
                tokens.len()
            )));
        }
        let special_id = |key: &str| -> Result<Option<u32>, TokenizerError> {
            match g.get(key) {
                None => Ok(None),
                Some(_) => {
                    let id = g.meta_u64(key)?;
                    if id as usize >= tokens.len() {
                        return Err(bad(format!("{key} = {id} is outside the vocabulary")));
                    }
                    Ok(Some(id as u32))
                }
            }
        };
        let (bos, eos) = (
            special_id("tokenizer.ggml.bos_token_id")?,
            special_id("tokenizer.ggml.eos_token_id")?,
        );
        let whole: Vec<bool> = types
            .iter()
            .map(|&t| t == CONTROL || t == USER_DEFINED)
            .collect();
        let mut t = Self::new(&tokens, &merges, &whole, pre).map_err(bad)?;
        t.bos = bos;
        t.eos = eos;
        Ok(t)
    }

    /// A tokenizer from its parts; `special[i]` marks token `i` as matched whole in text.
    /// Errors name the offending merge or token.
    pub fn new(
        tokens: &[&str],
        merges: &[&str],
        special: &[bool],
        pre: PreTokenizer,
    ) -> Result<Self, String> {
        let mut ids = HashMap::with_capacity(tokens.len());
        for (i, t) in tokens.iter().enumerate() {
            if ids.insert((*t).to_string(), i as u32).is_some() {
                return Err(format!("token {i} ({t:?}) is a duplicate"));
            }
        }
        let mut merge_map = HashMap::with_capacity(merges.len());
        for (rank, m) in merges.iter().enumerate() {
            let (a, b) = m
                .split_once(' ')
                .ok_or_else(|| format!("merge {rank} ({m:?}) is not two symbols"))?;
            let id = |s: &str| {
                ids.get(s)
                    .copied()
                    .ok_or_else(|| format!("merge {rank} ({m:?}): {s:?} is not in the vocabulary"))
            };
            let key = (id(a)?, id(b)?);
            let merged = id(&format!("{a}{b}"))?;
            // The first (lowest) rank of a pair wins, as in `tokenizers`.
            merge_map.entry(key).or_insert((rank as u32, merged));
        }
        let mut specials: Vec<(String, u32)> = tokens
            .iter()
            .zip(special)
            .enumerate()
            .filter(|(_, (t, &s))| s && !t.is_empty())
            .map(|(i, (t, _))| ((*t).to_string(), i as u32))
            .collect();
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        let mut is_special = vec![false; tokens.len()];
        specials
            .iter()
            .for_each(|(_, i)| is_special[*i as usize] = true);
        let byte_char = byte_alphabet();
        let char_byte = (0..=255u8).map(|b| (byte_char[b as usize], b)).collect();
        Ok(BpeTokenizer {
            tokens: tokens.iter().map(|t| (*t).to_string()).collect(),
            ids,
            merges: merge_map,
            specials,
            is_special,
            pre,
            byte_char,
            char_byte,
            bos: None,
            eos: None,
        })
    }

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.ids.get(token).copied()
    }

    /// Encodes text; control tokens written in it (`<|im_start|>`) become their ids.
    /// No BOS is added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let mut out = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            let (plain, special) = self.next_special(rest);
            self.encode_plain(&rest[..plain], &mut out)?;
            match special {
                Some((len, id)) => {
                    out.push(id);
                    rest = &rest[plain + len..];
                }
                None => break,
            }
        }
        Ok(out)
    }

    /// Decodes ids to text: byte-level tokens back to bytes (invalid UTF-8 becomes U+FFFD),
    /// control tokens as written.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        let mut bytes = Vec::new();
        for &id in ids {
            let tok = self
                .tokens
                .get(id as usize)
                .ok_or(TokenizerError::BadId(id))?;
            if self.is_special[id as usize] {
                bytes.extend(tok.as_bytes());
                continue;
            }
            for c in tok.chars() {
                match self.char_byte.get(&c) {
                    Some(&b) => bytes.push(b),
                    // Not byte-level (a hand-added token): keep the character itself.
                    None => bytes.extend(c.to_string().as_bytes()),
                }
            }
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Byte offset of the first special token in `s` (the longest one there) and its
    /// (length, id); `(s.len(), None)` if there is none.
    fn next_special(&self, s: &str) -> (usize, Option<(usize, u32)>) {
        for (i, _) in s.char_indices() {
            let tail = &s[i..];
            if let Some((t, id)) = self
                .specials
                .iter()
                .find(|(t, _)| tail.starts_with(t.as_str()))
            {
                return (i, Some((t.len(), *id)));
            }
        }
        (s.len(), None)
    }

    fn encode_plain(&self, text: &str, out: &mut Vec<u32>) -> Result<(), TokenizerError> {
        let pieces: Vec<&str> = match self.pre {
            PreTokenizer::Gpt2 => vec![text],
            PreTokenizer::Gpt2IndividualDigits => split_digits(text),
        };
        for piece in pieces {
            for word in gpt2_split(piece) {
                self.bpe(word, out)?;
            }
        }
        Ok(())
    }

    /// Merges the word's byte symbols, lowest merge rank first, every occurrence left to
    /// right, until no ranked pair is left.
    fn bpe(&self, word: &str, out: &mut Vec<u32>) -> Result<(), TokenizerError> {
        let mut syms = word
            .bytes()
            .map(|b| {
                let c = self.byte_char[b as usize];
                self.ids
                    .get(c.to_string().as_str())
                    .copied()
                    .ok_or_else(|| TokenizerError::NoToken(c.to_string()))
            })
            .collect::<Result<Vec<u32>, _>>()?;
        loop {
            let best = syms
                .windows(2)
                .filter_map(|w| {
                    self.merges
                        .get(&(w[0], w[1]))
                        .map(|&(r, m)| (r, w[0], w[1], m))
                })
                .min_by_key(|x| x.0);
            let Some((_, a, b, m)) = best else { break };
            let mut merged = Vec::with_capacity(syms.len());
            let mut i = 0;
            while i < syms.len() {
                if i + 1 < syms.len() && syms[i] == a && syms[i + 1] == b {
                    merged.push(m);
                    i += 2;
                } else {
                    merged.push(syms[i]);
                    i += 1;
                }
            }
            syms = merged;
        }
        out.extend(syms);
        Ok(())
    }
}

/// GPT-2's reversible byte -> printable character map (`bytes_to_unicode`).
pub fn byte_alphabet() -> [char; 256] {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff);
    let mut map = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        map[b as usize] = if printable(b) {
            char::from(b)
        } else {
            next += 1;
            char::from_u32(next - 1).unwrap_or('\0')
        };
    }
    map
}

/// Splits every numeric character into its own piece (`Digits(individual_digits=True)`).
fn split_digits(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, c) in s.char_indices() {
        if c.is_numeric() {
            if start < i {
                out.push(&s[start..i]);
            }
            out.push(&s[i..i + c.len_utf8()]);
            start = i + c.len_utf8();
        }
    }
    if start < s.len() {
        out.push(&s[start..]);
    }
    out
}

/// The GPT-2 pre-tokenizer regex, by hand:
/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
pub fn gpt2_split(s: &str) -> Vec<&str> {
    let cs: Vec<(usize, char)> = s.char_indices().collect();
    let n = cs.len();
    let at = |i: usize| if i < n { cs[i].0 } else { s.len() };
    let letter = |c: char| c.is_alphabetic();
    let number = |c: char| c.is_numeric() && !c.is_alphabetic();
    let other = |c: char| !c.is_whitespace() && !letter(c) && !number(c);
    let run = |from: usize, f: &dyn Fn(char) -> bool| (from..n).find(|&k| !f(cs[k].1)).unwrap_or(n);
    let mut out = Vec::new();
    let mut i = 0;
    while i < n {
        let c = cs[i].1;
        let next = |k: usize| cs.get(i + k).map(|x| x.1);
        let end = if c == '\'' && matches!(next(1), Some('s' | 't' | 'm' | 'd')) {
            i + 2
        } else if c == '\''
            && matches!(
                (next(1), next(2)),
                (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l'))
            )
        {
            i + 3
        } else {
            let j = if c == ' ' { i + 1 } else { i };
            match cs.get(j).map(|x| x.1) {
                Some(d) if letter(d) => run(j, &letter),
                Some(d) if number(d) => run(j, &number),
                Some(d) if other(d) => run(j, &other),
                _ => {
                    // Whitespace: all of it at the end of the text; before other text, all
                    // but the last character, which may lead the next word.
                    let e = run(i, &|c: char| c.is_whitespace());
                    if e == n || e - i == 1 {
                        e
                    } else {
                        e - 1
                    }
                }
            }
        };
        out.push(&s[at(i)..at(end)]);
        i = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::testfile::{strings, GgufBuilder};
    use crate::gguf::Value;

    #[test]
    fn gpt2_split_follows_the_regex_on_spaces_contractions_and_punctuation() {
        assert_eq!(
            gpt2_split("Hello world, 12!"),
            ["Hello", " world", ",", " 12", "!"]
        );
        assert_eq!(gpt2_split("a   b"), ["a", "  ", " b"]);
        assert_eq!(gpt2_split("x\ny"), ["x", "\n", "y"]);
        assert_eq!(gpt2_split("x \n\ny"), ["x", " \n", "\n", "y"]);
        assert_eq!(
            gpt2_split("it's we're I'll 'x"),
            ["it", "'s", " we", "'re", " I", "'ll", " '", "x"]
        );
        assert_eq!(gpt2_split("end  "), ["end", "  "]);
        assert_eq!(gpt2_split("?!..ok"), ["?!..", "ok"]);
        assert_eq!(gpt2_split("héllo wörld"), ["héllo", " wörld"]);
        assert!(gpt2_split("").is_empty());
    }

    #[test]
    fn digits_are_split_one_by_one_before_the_regex() {
        assert_eq!(split_digits("ab 123c"), ["ab ", "1", "2", "3", "c"]);
        assert_eq!(split_digits("7"), ["7"]);
    }

    #[test]
    fn byte_alphabet_is_a_bijection_that_maps_space_to_g_dot() {
        let a = byte_alphabet();
        let mut sorted = a.to_vec();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 256);
        assert_eq!(a[b' ' as usize], 'Ġ');
        assert_eq!(a[b'\n' as usize], 'Ċ');
        assert_eq!(a[b'A' as usize], 'A');
    }

    /// The 256 byte symbols, then merged tokens, then two control tokens.
    fn toy() -> BpeTokenizer {
        let bytes: Vec<String> = byte_alphabet().iter().map(|c| c.to_string()).collect();
        let mut tokens: Vec<&str> = bytes.iter().map(String::as_str).collect();
        tokens.extend(["bc", "ab", "Ġa", "Ġab", "<|s|>", "<|s|>x"]);
        let merges = ["b c", "a b", "Ġ a", "Ġa b"];
        let mut special = vec![false; tokens.len()];
        special[260] = true;
        special[261] = true;
        BpeTokenizer::new(
            &tokens,
            &merges,
            &special,
            PreTokenizer::Gpt2IndividualDigits,
        )
        .unwrap()
    }

    #[test]
    fn merges_apply_by_rank_not_by_position() {
        let t = toy();
        // "b c" outranks "a b": abc -> a + bc, never ab + c.
        assert_eq!(t.encode("abc").unwrap(), [b'a' as u32, 256]);
        assert_eq!(t.encode("ab").unwrap(), [257]);
        // "a b" outranks "Ġa b", so " ab" never reaches "Ġab".
        assert_eq!(t.encode(" ab").unwrap(), [b' ' as u32, 257]);
        assert_eq!(t.encode(" abc").unwrap(), [258, 256]);
    }

    #[test]
    fn control_tokens_are_matched_whole_and_longest_first() {
        let t = toy();
        assert_eq!(t.encode("<|s|>ab").unwrap(), [260, 257]);
        assert_eq!(t.encode("<|s|>xab").unwrap(), [261, 257]);
        assert_eq!(t.encode("a<|s|>").unwrap(), [b'a' as u32, 260]);
        assert_eq!(t.decode(&[260, 257]).unwrap(), "<|s|>ab");
    }

    #[test]
    fn decode_inverts_encode_for_any_bytes() {
        let t = toy();
        for s in ["héllo wörld ✓", "a\n\n  b\t", "x 12 345!", "日本語"] {
            assert_eq!(t.decode(&t.encode(s).unwrap()).unwrap(), s);
        }
        assert!(matches!(t.decode(&[999]), Err(TokenizerError::BadId(999))));
    }

    #[test]
    fn gguf_metadata_builds_the_tokenizer_and_bad_merges_name_themselves() {
        let bytes: Vec<String> = byte_alphabet().iter().map(|c| c.to_string()).collect();
        let mut toks: Vec<&str> = bytes.iter().map(String::as_str).collect();
        toks.extend(["ab", "<|end|>"]);
        let mut types = vec![Value::I32(1); 257];
        types.push(Value::I32(3));
        let file = |merges: &[&str]| {
            GgufBuilder::default()
                .kv("tokenizer.ggml.model", Value::String("gpt2".into()))
                .kv("tokenizer.ggml.pre", Value::String("smollm".into()))
                .kv("tokenizer.ggml.tokens", strings(&toks))
                .kv("tokenizer.ggml.token_type", Value::Array(5, types.clone()))
                .kv("tokenizer.ggml.merges", strings(merges))
                .kv("tokenizer.ggml.eos_token_id", Value::U32(257))
                .build()
        };
        let g = Gguf::parse(file(&["a b"]), "tok.gguf").unwrap();
        let t = BpeTokenizer::from_gguf(&g).unwrap();
        assert_eq!((t.eos, t.bos, t.vocab_size()), (Some(257), None, 258));
        assert_eq!(t.encode("ab<|end|>").unwrap(), [256, 257]);
        let g = Gguf::parse(file(&["a q"]), "tok.gguf").unwrap();
        let Err(e) = BpeTokenizer::from_gguf(&g) else {
            panic!("a merge whose result is not a token must fail")
        };
        let e = e.to_string();
        assert!(e.contains("tok.gguf") && e.contains("merge 0"), "{e}");
    }
}
