//! Trace loaders: Weka (JSON / JSONL, hash_ids / hash_runs, plain / gzip, sub-agents),
//! Mooncake, Azure, format detection, and errors that point at the file and line.

use std::path::{Path, PathBuf};

use genslot::workload::{
    load_azure, load_mooncake, load_trace, load_weka, weka::parse_weka_str, Session, Trace,
    TraceFormat, WorkloadError,
};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/workload")
        .join(name)
}

fn weka(name: &str) -> Vec<Session> {
    match load_weka(&fixture(name)) {
        Ok(s) => s,
        Err(e) => panic!("{name} should load: {e}"),
    }
}

#[test]
fn hash_ids_json_and_hash_runs_jsonl_load_identically() {
    let single = weka("weka_single.json");
    let runs = weka("weka_runs.jsonl");
    assert_eq!(single.len(), 1);
    assert_eq!(runs.len(), 2, "one session per JSONL line");
    assert_eq!(single[0], runs[0]);
    assert_eq!(runs[1].id, "fx_2");
    assert_eq!(
        runs[1].requests[2].hash_ids.to_vec(),
        vec![7, 8, 9, 40, 41, 42, 43, 44]
    );
}

#[test]
fn gzip_is_detected_by_content_not_extension() {
    let plain = weka("weka_runs.jsonl");
    assert_eq!(weka("weka_runs.jsonl.gz"), plain);
    assert_eq!(weka("weka_gzip_content.jsonl"), plain);
}

#[test]
fn weka_fields_map_onto_the_session() {
    let s = &weka("weka_single.json")[0];
    assert_eq!(s.id, "fx_1");
    assert_eq!(s.block_size, 64);
    assert_eq!(s.requests.len(), 4, "the marker is not a request");
    assert_eq!(s.total_requests(), 6);
    let r0 = &s.requests[0];
    assert_eq!((r0.input_tokens, r0.output_tokens), (1000, 100));
    assert_eq!(r0.hash_ids.len(), 16);
    assert_eq!(r0.api_time, Some(2.0));
    assert!(!r0.streaming);
    assert!(s.requests[2].streaming, "type \"s\" is streaming");
    assert_eq!(
        s.requests[3].api_time, None,
        "missing api_time stays unknown"
    );
    assert_eq!(s.requests[2].think_time, None);
}

#[test]
fn completed_subagent_starts_duration_before_its_marker_and_inner_times_become_absolute() {
    let s = &weka("weka_single.json")[0];
    assert_eq!(s.subagents.len(), 1);
    let sub = &s.subagents[0];
    assert_eq!(
        sub.after_request, 2,
        "spawned after the parent's second request"
    );
    assert_eq!(sub.marker_t, 40.0);
    assert_eq!(sub.spawn_t, 20.0, "marker t minus duration_ms");
    assert_eq!(sub.end_t, 40.0);
    assert_eq!(sub.agent_id, "agent_001");
    assert_eq!(sub.subagent_type, "Explore");
    let times: Vec<f64> = sub.session.requests.iter().map(|r| r.t).collect();
    assert_eq!(times, vec![20.0, 30.0]);
    assert_eq!(sub.session.id, "fx_1/agent_001");
}

#[test]
fn subagent_inner_times_already_absolute_are_kept() {
    let text = r#"{"id":"abs","requests":[
        {"t":0,"in":10,"out":1,"hash_ids":[1],"api_time":1},
        {"t":40,"type":"subagent","duration_ms":20000,"requests":[
            {"t":20,"in":5,"out":1,"hash_ids":[9]},{"t":30,"in":6,"out":1,"hash_ids":[9]}]}]}"#;
    let s = parse_weka_str(text, Path::new("inline.json")).unwrap();
    let times: Vec<f64> = s[0].subagents[0]
        .session
        .requests
        .iter()
        .map(|r| r.t)
        .collect();
    assert_eq!(times, vec![20.0, 30.0]);
}

#[test]
fn async_launched_subagent_without_duration_starts_at_its_marker() {
    let text = r#"{"id":"async","requests":[
        {"t":0,"in":10,"out":1,"hash_ids":[1],"api_time":1},
        {"t":5,"type":"subagent","status":"async_launched","requests":[
            {"t":0,"in":5,"out":1,"hash_ids":[9],"api_time":2},{"t":4,"in":6,"out":1,"hash_ids":[9],"api_time":3}]}]}"#;
    let s = parse_weka_str(text, Path::new("inline.json")).unwrap();
    let sub = &s[0].subagents[0];
    assert_eq!(sub.spawn_t, 5.0);
    assert_eq!(sub.end_t, 12.0, "last inner request ends at 5 + 4 + 3");
}

#[test]
fn mooncake_timestamps_are_milliseconds_and_blocks_are_512_tokens() {
    let reqs = load_mooncake(&fixture("mooncake.jsonl")).unwrap();
    assert_eq!(reqs.len(), 4);
    let t: Vec<f64> = reqs.iter().map(|r| r.t).collect();
    assert_eq!(t, vec![0.0, 1.5, 2.5, 4.0]);
    assert_eq!(reqs[1].input_tokens, 600);
    assert_eq!(reqs[1].output_tokens, 5);
    assert_eq!(reqs[1].hash_ids.to_vec(), vec![0, 3]);
    assert!(reqs.iter().all(|r| r.block_size == 512));
}

#[test]
fn azure_times_are_seconds_after_the_first_row_whatever_the_fraction_digits() {
    let reqs = load_azure(&fixture("azure.csv")).unwrap();
    let t: Vec<f64> = reqs.iter().map(|r| r.t).collect();
    let want = [0.0, 4.314_579, 4.819_41, 13.319_41];
    for (got, want) in t.iter().zip(want) {
        assert!((got - want).abs() < 1e-6, "{t:?}");
    }
    assert_eq!((reqs[2].input_tokens, reqs[2].output_tokens), (110, 27));
    assert!(reqs
        .iter()
        .all(|r| r.hash_ids.is_empty() && r.block_size == 0));
}

#[test]
fn azure_extra_columns_and_zone_suffixes_are_accepted() {
    let reqs = load_azure(&fixture("azure_2025.csv")).unwrap();
    assert_eq!(reqs.len(), 2);
    assert!((reqs[1].t - 1.25).abs() < 1e-9);
    assert_eq!((reqs[1].input_tokens, reqs[1].output_tokens), (200, 6));
}

#[test]
fn load_trace_detects_every_format() {
    let cases = [
        ("weka_single.json", TraceFormat::Weka),
        ("weka_runs.jsonl.gz", TraceFormat::Weka),
        ("mooncake.jsonl", TraceFormat::Mooncake),
        ("azure.csv", TraceFormat::Azure),
    ];
    for (name, want) in cases {
        let trace = load_trace(&fixture(name), None).unwrap();
        assert_eq!(trace.format(), want, "{name}");
        let explicit = load_trace(&fixture(name), Some(want)).unwrap();
        assert_eq!(explicit.format(), want);
    }
    match load_trace(&fixture("weka_runs.jsonl"), None).unwrap() {
        Trace::Sessions(s) => assert_eq!(s.len(), 2),
        other => panic!("expected sessions, got {:?}", other.format()),
    }
}

#[test]
fn a_directory_of_weka_files_loads_in_name_order() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture("weka_single.json"), dir.path().join("b.json")).unwrap();
    std::fs::copy(fixture("weka_runs.jsonl.gz"), dir.path().join("a.jsonl.gz")).unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not a trace").unwrap();
    let sessions = load_weka(dir.path()).unwrap();
    let ids: Vec<&str> = sessions.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, vec!["fx_1", "fx_2", "fx_1"]);
}

fn error_of(r: Result<impl std::fmt::Debug, WorkloadError>) -> String {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_weka_request_missing_a_field_names_file_line_and_field() {
    let msg = error_of(load_weka(&fixture("weka_missing_field.jsonl")));
    assert!(msg.contains("weka_missing_field.jsonl:2:"), "{msg}");
    assert!(msg.contains("fx_2 request 1"), "{msg}");
    assert!(msg.contains("`in`"), "{msg}");
}

#[test]
fn a_weka_turn_with_no_prompt_a_negative_time_or_a_time_going_back_is_refused_by_name() {
    let refused = |requests: &str| {
        let text = format!(r#"{{"id":"x","requests":[{requests}]}}"#);
        error_of(parse_weka_str(&text, Path::new("inline.json")))
    };
    let msg = refused(r#"{"t":0,"in":0,"out":3,"hash_ids":[]}"#);
    assert!(msg.contains("x request 0: field `in` is 0"), "{msg}");
    let msg = refused(r#"{"t":-2,"in":4,"out":3,"hash_ids":[1]}"#);
    assert!(msg.contains("x request 0: field `t` is -2"), "{msg}");
    let msg =
        refused(r#"{"t":5,"in":4,"out":3,"hash_ids":[1]},{"t":4,"in":4,"out":3,"hash_ids":[1]}"#);
    assert!(
        msg.contains("x request 1: field `t` is 4, before the previous entry's 5"),
        "{msg}"
    );
    // Inside a sub-agent too, named by where it sits.
    let msg = refused(
        r#"{"t":0,"in":4,"out":1,"hash_ids":[1]},{"t":9,"type":"subagent","requests":[
            {"t":3,"in":4,"out":1,"hash_ids":[1]},{"t":1,"in":4,"out":1,"hash_ids":[1]}]}"#,
    );
    assert!(
        msg.contains("x request 1 request 1: field `t` is 1"),
        "{msg}"
    );
    // What real traces hold stays accepted: an empty output, equal times.
    let text = r#"{"id":"ok","requests":[{"t":0,"in":4,"out":0,"hash_ids":[1]},
        {"t":0,"in":4,"out":2,"hash_ids":[1]}]}"#;
    let s = parse_weka_str(text, Path::new("inline.json")).expect("accepted");
    assert_eq!(s[0].requests.len(), 2);
}

#[test]
fn broken_weka_json_names_file_and_line() {
    let msg = error_of(load_weka(&fixture("weka_bad_json.jsonl")));
    assert!(msg.contains("weka_bad_json.jsonl:3:"), "{msg}");
}

#[test]
fn a_bad_mooncake_line_names_file_and_line() {
    let msg = error_of(load_mooncake(&fixture("mooncake_bad.jsonl")));
    assert!(msg.contains("mooncake_bad.jsonl:3:"), "{msg}");
    assert!(
        msg.contains("input_length") || msg.contains("invalid type"),
        "{msg}"
    );
}

#[test]
fn a_bad_azure_timestamp_names_file_and_line() {
    let msg = error_of(load_azure(&fixture("azure_bad.csv")));
    assert!(msg.contains("azure_bad.csv:4:"), "{msg}");
    assert!(msg.contains("TIMESTAMP"), "{msg}");
}

#[test]
fn missing_files_and_unknown_formats_are_errors_not_panics() {
    let msg = error_of(load_trace(&fixture("does_not_exist.jsonl"), None));
    assert!(msg.contains("does_not_exist.jsonl"), "{msg}");
    let dir = tempfile::tempdir().unwrap();
    let odd = dir.path().join("odd.txt");
    std::fs::write(&odd, "hello\nworld\n").unwrap();
    assert!(matches!(
        load_trace(&odd, None),
        Err(WorkloadError::UnknownFormat { .. })
    ));
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "\n").unwrap();
    assert!(matches!(
        load_mooncake(&empty),
        Err(WorkloadError::Empty { .. })
    ));
}

/// The text of `name` written into a fresh directory, and its path.
fn written(name: &str, text: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

/// The error as `genslot` prints it: the message and every cause in its chain.
fn printed(e: WorkloadError) -> String {
    format!("{:#}", anyhow::Error::from(e))
}

#[test]
fn a_bad_mooncake_value_names_the_files_line_and_the_column_within_it_only() {
    let msg = error_of(load_mooncake(&fixture("mooncake_bad.jsonl")));
    assert!(
        msg.starts_with(&format!("{}:3: ", fixture("mooncake_bad.jsonl").display())),
        "{msg}"
    );
    assert!(
        msg.contains("expected u32") || msg.contains("expected u64"),
        "{msg}"
    );
    assert!(msg.ends_with("(column 42)"), "{msg}");
    assert!(!msg.contains("line 1"), "{msg}");
}

#[test]
fn bad_weka_json_names_the_line_its_object_breaks_on_and_the_column_once() {
    let (_dir, path) = written("w.jsonl", b"{\"id\": \"a\", \"requests\": []}\n{\"id\": \n");
    let msg = error_of(load_trace(&path, None));
    assert!(
        msg.ends_with("w.jsonl:2: bad Weka JSON: EOF while parsing a value"),
        "{msg}"
    );
    let (_dir, path) = written(
        "w.jsonl",
        b"{\"id\": \"a\", \"requests\": []}\n{\"id\": ]\n",
    );
    let msg = error_of(load_trace(&path, None));
    assert!(msg.contains("w.jsonl:2: bad Weka JSON: "), "{msg}");
    assert!(msg.ends_with("(column 8)"), "{msg}");
    assert!(!msg.contains(" at line "), "{msg}");
}

#[test]
fn a_missing_file_prints_its_cause_once() {
    let e = load_trace(Path::new("no-such-trace.jsonl"), None).unwrap_err();
    let msg = printed(e);
    assert!(msg.starts_with("no-such-trace.jsonl: "), "{msg}");
    assert_eq!(msg.matches("(os error 2)").count(), 1, "{msg}");
}

#[test]
fn a_broken_gzip_stream_is_named_and_its_cause_printed_once() {
    let mut gz = Vec::new();
    {
        use std::io::Write as _;
        let mut enc = flate2::write::GzEncoder::new(&mut gz, flate2::Compression::default());
        enc.write_all(b"{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1}\n")
            .unwrap();
        enc.finish().unwrap();
    }
    gz.truncate(gz.len() / 2);
    let (_dir, path) = written("cut.jsonl.gz", &gz);
    let msg = printed(load_trace(&path, None).unwrap_err());
    assert!(msg.contains("cut.jsonl.gz: bad gzip stream: "), "{msg}");
    let cause = msg.rsplit(": ").next().unwrap();
    assert_eq!(msg.matches(cause).count(), 1, "{msg}");
}

#[test]
fn an_empty_or_blank_trace_has_no_requests_whatever_its_format() {
    for text in ["", "\n\n  \n"] {
        let (_dir, path) = written("t.jsonl", text.as_bytes());
        let e = load_trace(&path, None).unwrap_err();
        assert!(matches!(e, WorkloadError::Empty { .. }), "{text:?}: {e}");
        assert!(e.to_string().ends_with("no requests in the trace"), "{e}");
    }
}

#[test]
fn a_trace_of_no_known_format_names_its_first_line_and_every_format_tried() {
    let (_dir, path) = written("odd.csv", b"\n\nhello,world\nmore\n");
    let msg = error_of(load_trace(&path, None));
    assert!(msg.contains("odd.csv:3: "), "{msg}");
    assert!(msg.contains("`hello,world`"), "{msg}");
    for format in ["Weka", "Mooncake", "Azure"] {
        assert!(msg.contains(format), "{msg}");
    }
}

#[test]
fn a_mooncake_line_without_timestamp_first_is_read_as_mooncake_and_named() {
    let (_dir, path) = written(
        "mc.jsonl",
        b"{\"input_length\": 10, \"output_length\": 5, \"hash_ids\": [0]}\n\
          {\"timestamp\": 1200, \"input_length\": 10, \"output_length\": 5}\n",
    );
    let msg = error_of(load_trace(&path, None));
    assert!(
        msg.ends_with("mc.jsonl:1: missing field `timestamp`"),
        "{msg}"
    );
}

#[test]
fn an_azure_header_missing_a_column_is_read_as_azure_and_names_the_column() {
    let (_dir, path) = written(
        "az.csv",
        b"TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,374\n",
    );
    let msg = error_of(load_trace(&path, None));
    assert!(
        msg.ends_with("az.csv:1: header lacks column `generatedtokens`"),
        "{msg}"
    );
}

#[test]
fn a_directory_named_as_one_file_format_is_refused_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let msg = error_of(load_trace(dir.path(), Some(TraceFormat::Mooncake)));
    assert!(
        msg.contains("a directory is read as Weka trace files"),
        "{msg}"
    );
}
