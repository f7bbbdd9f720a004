//! Request sources built from `genslot::workload` traces and replay engines.

use anyhow::bail;

use crate::cli::RunArgs;
use crate::source::{FixedLanes, Source};

pub fn build(args: &RunArgs) -> anyhow::Result<(Box<dyn Source>, String)> {
    let s = &args.source;
    if s.synthetic {
        let c = args.concurrency.unwrap_or(1);
        return Ok((
            Box::new(FixedLanes::new(c, 2048, 256, 1.0, true)),
            "fixed lanes".into(),
        ));
    }
    bail!("trace sources are not wired yet")
}
