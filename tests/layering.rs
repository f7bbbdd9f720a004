//! The module layering (README, "Layers"): no module imports one from a higher layer. The
//! check reads the sources: every `crate::<module>` path in code (comments stripped), in a
//! `use` or written inline, grouped imports (`crate::{a, b}`) included.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// Bottom to top. A layer holds one or more groups of modules; a module may import its own
/// group and every lower layer, never a higher layer nor another group of its own layer.
const LAYERS: &[&[&[&str]]] = &[
    // Roots: shared ids, metric names, sampling parameters, trace readers, the GGUF reader,
    // the stop signals.
    &[
        &["ids"],
        &["metrics"],
        &["sampling"],
        &["workload"],
        &["gguf"],
        &["signal"],
    ],
    // The decision core; it asks about room through closures and never sees a pool.
    &[&["policy"]],
    // Pool accounting; answers the core in the core's types (`PoolReport`).
    &[&["pools"]],
    &[&["config"]],
    // The clock and the step/transfer/prefill time models.
    &[&["timing"]],
    // The pass machine over ports.
    &[&["worker"]],
    // The HTTP surface and the traits it serves through (`Engine`, `Tokenizer`).
    &[&["server"]],
    // A checkpoint's text: tokenizer, chat template, EOS (the server's `Tokenizer` trait).
    &[&["text"]],
    // Side by side: the simulator, and the step backends with their model files. Neither
    // imports the other.
    &[&["sim"], &["gpu"]],
    // The runtime that wires worker, backends and server together.
    &[&["actors"]],
];

/// `(layer, group)` of a module.
fn place_of(module: &str) -> Option<(usize, usize)> {
    LAYERS.iter().enumerate().find_map(|(l, groups)| {
        groups
            .iter()
            .position(|g| g.contains(&module))
            .map(|g| (l, g))
    })
}

/// Whether `from` may import `to`.
fn may_import(from: (usize, usize), to: (usize, usize)) -> bool {
    to.0 < from.0 || to == from
}

/// The source with `//` comments removed (string literals holding `//` are rare enough in
/// this crate that the check reads them as comments; that only hides text, never adds it).
fn code_of(text: &str) -> String {
    text.lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules a source names through `crate::`.
fn crate_modules(text: &str) -> Vec<String> {
    let code = code_of(text);
    let mut out = Vec::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("crate::") {
        let preceded_by_ident = rest[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_');
        rest = &rest[i + "crate::".len()..];
        if preceded_by_ident {
            continue; // `other_crate::`, not this crate
        }
        if let Some(group) = rest.strip_prefix('{') {
            // A grouped import: the first identifier of every top-level item.
            let mut depth = 0usize;
            let mut item_start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && (c.is_alphabetic() || c == '_') => {
                        item_start = false;
                        out.push(ident_at(&group[j..]));
                    }
                    _ => {}
                }
            }
        } else {
            out.push(ident_at(rest));
        }
    }
    out.retain(|m| !m.is_empty() && m != "self");
    out
}

fn ident_at(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// `(importing file, imported module)` for every import that runs upward (or sideways to
/// another group) from `module`.
fn upward_imports(module: &str, file: &str, text: &str) -> Vec<(String, String)> {
    let Some(own) = place_of(module) else {
        return Vec::new();
    };
    crate_modules(text)
        .into_iter()
        .filter(|m| place_of(m).is_some_and(|to| !may_import(own, to)))
        .map(|m| (file.to_string(), m))
        .collect()
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, into);
        } else if p.extension().is_some_and(|x| x == "rs") {
            into.push(p);
        }
    }
}

/// Every top-level module of the library with its files (`src/x.rs` or `src/x/**.rs`).
fn modules() -> BTreeMap<String, Vec<PathBuf>> {
    let mut out = BTreeMap::new();
    for e in fs::read_dir(src()).expect("src/ is readable").flatten() {
        let p = e.path();
        let name = p
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        // The binaries sit above every layer.
        if ["lib", "main", "bin"].contains(&name.as_str()) {
            continue;
        }
        let mut files = Vec::new();
        if p.is_dir() {
            rust_files(&p, &mut files);
        } else if p.extension().is_some_and(|x| x == "rs") {
            files.push(p);
        } else {
            continue;
        }
        out.entry(name).or_insert_with(Vec::new).extend(files);
    }
    out
}

#[test]
fn no_module_imports_one_from_a_higher_layer() {
    let mut upward = Vec::new();
    for (module, files) in modules() {
        for f in files {
            let text = fs::read_to_string(&f).expect("a source file is readable");
            let shown = f.strip_prefix(src()).unwrap_or(&f).display().to_string();
            upward.extend(upward_imports(&module, &shown, &text));
        }
    }
    assert!(
        upward.is_empty(),
        "imports from a higher layer (file → module): {upward:#?}"
    );
}

#[test]
fn every_module_of_the_library_has_a_layer() {
    let unplaced: Vec<String> = modules()
        .into_keys()
        .filter(|m| place_of(m).is_none())
        .collect();
    assert!(
        unplaced.is_empty(),
        "place these modules in LAYERS (tests/layering.rs) and README: {unplaced:?}"
    );
}

#[test]
fn the_scan_finds_plain_inline_and_grouped_imports_and_ignores_comments() {
    let text = "use crate::sim::plant::Plant;\n\
                let x = crate::actors::serve::start();\n\
                use crate::{timing::Clock, server::{engine, latency}};\n\
                use other_crate::worker::X;\n\
                // use crate::actors::Nothing;\n";
    assert_eq!(crate_modules(text), ["sim", "actors", "timing", "server"]);
    let up = upward_imports("gpu", "gpu/model.rs", text);
    assert_eq!(
        up.iter().map(|(_, m)| m.as_str()).collect::<Vec<_>>(),
        ["sim", "actors"],
        "gpu may import timing and server, never the simulator beside it nor actors above"
    );
    assert_eq!(
        upward_imports("policy", "policy/x.rs", "use crate::pools::KvBudget;").len(),
        1
    );
    assert!(upward_imports("pools", "pools/x.rs", "use crate::policy::RequestId;").is_empty());
    assert!(upward_imports("text", "text/x.rs", "use crate::gguf::Gguf;").is_empty());
}
