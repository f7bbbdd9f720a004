//! Where each key of a YAML document sits, so that errors found after parsing (validation)
//! can point at a line and column.
//!
//! How: we run the YAML parser that serde-saphyr itself uses (`granit_parser`, re-exported by
//! serde-saphyr) over the same text and walk its event stream, keeping a stack of open
//! mappings and sequences. Every scalar in key position is recorded under its dotted path
//! (`scheduler_config.gen_preemption.tpot_budget`; sequence items as `name[3]`) with the
//! position of the key's first character. Using the parser rather than a line scan means flow
//! mappings (`{ a: 1, b: 2 }`), quoting and comments are located exactly as they were parsed.

use serde_saphyr::granit_parser::{Event, Parser};
use std::collections::BTreeMap;
use std::fmt;

/// A place in a YAML text: 1-based line and 1-based column (in characters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    pub line: u32,
    pub column: u32,
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}, column {}", self.line, self.column)
    }
}

/// Dotted key path → position of that key in the text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyLocations {
    keys: BTreeMap<String, Position>,
}

enum Frame {
    Map {
        path: String,
        /// The next node is a key (true) or a value (false).
        at_key: bool,
        key: String,
    },
    Seq {
        path: String,
        index: usize,
    },
}

impl KeyLocations {
    /// Scans `text`. Best effort: a syntax error ends the scan with what was found so far
    /// (the deserializer reports the syntax error itself, with its own position).
    pub fn scan(text: &str) -> Self {
        let mut keys = BTreeMap::new();
        let mut stack: Vec<Frame> = Vec::new();
        for item in Parser::new_from_str(text) {
            let Ok((event, span)) = item else { break };
            let pos = Position {
                line: to_u32(span.start.line()),
                column: to_u32(span.start.col() + 1),
            };
            match event {
                Event::Scalar(value, ..) => {
                    if let Some(Frame::Map {
                        path, at_key: true, ..
                    }) = stack.last()
                    {
                        let full = join(path, &value);
                        keys.entry(full).or_insert(pos);
                        if let Some(Frame::Map { key, .. }) = stack.last_mut() {
                            *key = value.into_owned();
                        }
                    }
                    node_done(&mut stack);
                }
                Event::Alias(_) => node_done(&mut stack),
                Event::MappingStart(..) => {
                    let path = child_path(&stack);
                    stack.push(Frame::Map {
                        path,
                        at_key: true,
                        key: String::new(),
                    });
                }
                Event::SequenceStart(..) => {
                    let path = child_path(&stack);
                    stack.push(Frame::Seq { path, index: 0 });
                }
                Event::MappingEnd | Event::SequenceEnd => {
                    stack.pop();
                    node_done(&mut stack);
                }
                _ => {}
            }
        }
        KeyLocations { keys }
    }

    /// True when `text` holds no YAML node at all (empty, blank or only comments).
    pub fn is_empty_document(text: &str) -> bool {
        !Parser::new_from_str(text).any(|item| {
            matches!(
                item,
                Ok((
                    Event::Scalar(..)
                        | Event::MappingStart(..)
                        | Event::SequenceStart(..)
                        | Event::Alias(_),
                    _
                )) | Err(_)
            )
        })
    }

    /// Every key's dotted path, in order.
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.keys.keys().map(String::as_str)
    }

    /// Position of the key at `path` (dotted), if the text has it.
    pub fn get(&self, path: &str) -> Option<Position> {
        self.keys.get(path).copied()
    }

    /// The path of the key that starts at `pos`, or failing that the last key that starts
    /// on the same line at or before `pos`.
    pub fn path_at(&self, pos: Position) -> Option<&str> {
        self.keys
            .iter()
            .filter(|(_, p)| p.line == pos.line && p.column <= pos.column)
            .max_by_key(|(_, p)| p.column)
            .map(|(k, _)| k.as_str())
    }
}

/// A scalar value as the parser read it: its text and the line it ends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScalarAt {
    pub value: String,
    pub first_line: u32,
    pub last_line: u32,
}

/// The scalar that starts at `pos`, if one does. An error about a value is clearer with the
/// value beside it, above all when a plain scalar ran on over the next lines (an over-indented
/// `key: value` there folds into the value above instead of being a key).
pub fn scalar_at(text: &str, pos: Position) -> Option<ScalarAt> {
    Parser::new_from_str(text)
        .map_while(Result::ok)
        .find_map(|(event, span)| match event {
            Event::Scalar(value, ..)
                if to_u32(span.start.line()) == pos.line
                    && to_u32(span.start.col() + 1) == pos.column =>
            {
                Some(ScalarAt {
                    value: value.into_owned(),
                    first_line: pos.line,
                    last_line: to_u32(span.end.line()),
                })
            }
            _ => None,
        })
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// Path of a collection that starts now, from the position it starts in.
fn child_path(stack: &[Frame]) -> String {
    match stack.last() {
        None => String::new(),
        // A collection used as a mapping key has no dotted path of its own.
        Some(Frame::Map {
            path, at_key: true, ..
        }) => join(path, "?"),
        Some(Frame::Map { path, key, .. }) => join(path, key),
        Some(Frame::Seq { path, index }) => format!("{path}[{index}]"),
    }
}

/// A whole node (scalar, alias or collection) finished inside the top frame.
fn node_done(stack: &mut [Frame]) {
    match stack.last_mut() {
        Some(Frame::Map { at_key, .. }) => *at_key = !*at_key,
        Some(Frame::Seq { index, .. }) => *index += 1,
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_scalar_that_runs_on_over_an_over_indented_line_is_read_whole() {
        let text = "max_batch_size: 64\n  bad_indent 1\nbackend: model\n";
        let at = scalar_at(
            text,
            Position {
                line: 1,
                column: 17,
            },
        )
        .expect("a scalar there");
        assert_eq!(at.value, "64 bad_indent 1");
        assert_eq!((at.first_line, at.last_line), (1, 2));
        assert_eq!(scalar_at(text, Position { line: 1, column: 3 }), None);
    }

    #[test]
    fn block_keys_are_found_at_their_line_and_column() {
        let text = "backend: model\nscheduler_config:\n  gen_preemption:\n    tpot_budget: 0.1\n";
        let k = KeyLocations::scan(text);
        assert_eq!(k.get("backend"), Some(Position { line: 1, column: 1 }));
        assert_eq!(
            k.get("scheduler_config.gen_preemption"),
            Some(Position { line: 3, column: 3 })
        );
        assert_eq!(
            k.get("scheduler_config.gen_preemption.tpot_budget"),
            Some(Position { line: 4, column: 5 })
        );
    }

    #[test]
    fn flow_mapping_keys_are_found_on_their_line() {
        let text = "# header\nparallel: { tensor_parallel_size: 1, pipeline_parallel_size: 2 }\n";
        let k = KeyLocations::scan(text);
        assert_eq!(
            k.get("parallel.pipeline_parallel_size"),
            Some(Position {
                line: 2,
                column: 38
            })
        );
        assert_eq!(
            k.path_at(Position {
                line: 2,
                column: 50
            }),
            Some("parallel.pipeline_parallel_size")
        );
    }

    #[test]
    fn sequence_items_and_values_do_not_become_keys() {
        let text = "a:\n  - { b: 1 }\n  - c\nd: e\n";
        let k = KeyLocations::scan(text);
        assert_eq!(k.get("a[0].b"), Some(Position { line: 2, column: 7 }));
        assert_eq!(k.get("d"), Some(Position { line: 4, column: 1 }));
        assert_eq!(k.get("e"), None);
        assert_eq!(k.get("a.c"), None);
    }

    #[test]
    fn a_syntax_error_keeps_the_keys_before_it() {
        let text = "a: 1\nb: [\n";
        let k = KeyLocations::scan(text);
        assert_eq!(k.get("a"), Some(Position { line: 1, column: 1 }));
    }
}
