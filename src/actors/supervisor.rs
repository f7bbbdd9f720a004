//! The supervisor: runs the setup decision (SPEC §4.4) before any pool is sized, gives the
//! one warning when configured preemption stays off, and can turn preemption off at run
//! time (an actor failure, an operator call). It never leaves preemption half-on: disabling
//! goes through `GenPreemption::disable`, so paused requests resume at the next pass.

use actix::{Actor, Addr, Context, Handler, MessageResult};
use serde::Serialize;

use super::executor::Executor;
use super::messages::{Disable, DisablePreemption, GetSupervisorState};
use crate::config::Config;
use crate::policy::setup::{OffReason, SetupError};
use crate::policy::Mode;
use crate::worker::{sizing, WorkerParams};

/// What `/debug/actors` shows for the supervisor.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SupervisorState {
    /// Preemption runs now.
    pub enabled: bool,
    /// The mode the config asked for.
    pub configured: Mode,
    /// The mode that runs (Off when disabled).
    pub mode: Mode,
    /// Why preemption is off although configured.
    pub reason: Option<OffReason>,
    /// The warning the supervisor logged, word for word.
    pub warning: Option<String>,
    /// Actor failures it was told about.
    pub failures: Vec<String>,
}

/// The setup decision and the worker it sizes. Logs the warning (`tracing::warn!`) once.
pub fn setup(cfg: &Config) -> Result<(WorkerParams, SupervisorState), SetupError> {
    let configured = cfg.preemption().unwrap_or(Mode::Off);
    let (params, decision) = sizing::resolve(cfg)?;
    let warning = decision.warning.as_ref().map(OffReason::message);
    if let Some(w) = &warning {
        tracing::warn!("{w}");
    }
    let state = SupervisorState {
        enabled: decision.mode.is_on(),
        configured,
        mode: decision.mode,
        reason: decision.warning,
        warning,
        failures: Vec::new(),
    };
    Ok((params, state))
}

pub struct Supervisor {
    state: SupervisorState,
    executor: Option<Addr<Executor>>,
}

impl Supervisor {
    pub fn new(state: SupervisorState) -> Self {
        Supervisor {
            state,
            executor: None,
        }
    }
}

impl Actor for Supervisor {
    type Context = Context<Self>;
}

/// The executor to act on (set once both actors exist).
#[derive(actix::Message)]
#[rtype(result = "()")]
pub struct Attach(pub Addr<Executor>);

impl Handler<Attach> for Supervisor {
    type Result = ();
    fn handle(&mut self, msg: Attach, _: &mut Context<Self>) {
        self.executor = Some(msg.0);
    }
}

impl Handler<Disable> for Supervisor {
    type Result = ();
    fn handle(&mut self, msg: Disable, _: &mut Context<Self>) {
        self.state.failures.push(msg.why.clone());
        if !self.state.enabled {
            return; // already off: one warning per decision
        }
        let reason = OffReason::Disabled { why: msg.why };
        let warning = reason.message();
        tracing::warn!("{warning}");
        self.state.enabled = false;
        self.state.mode = Mode::Off;
        self.state.reason = Some(reason);
        self.state.warning = Some(warning);
        if let Some(ex) = &self.executor {
            ex.do_send(DisablePreemption);
        }
    }
}

impl Handler<GetSupervisorState> for Supervisor {
    type Result = MessageResult<GetSupervisorState>;
    fn handle(&mut self, _: GetSupervisorState, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.state.clone())
    }
}
