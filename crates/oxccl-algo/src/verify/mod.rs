//! The verifier: proves a program computes its collective.
//!
//! [`verify`] executes the program symbolically for every rank at once.
//! Every element's value is the set of contributions it holds (see
//! `sym`), tracked over intervals, so a 256-rank program over a million
//! elements is proven in milliseconds. It establishes, or rejects with an
//! error naming the rank, channel, step and what is wrong:
//!
//! - **result**: every output element holds exactly the contributions the
//!   collective defines: none missing, none counted twice (caught at the
//!   reduction that counts it), none from the wrong index, the right root;
//! - **matching**: every message is received, in order, by a step that
//!   expects its length; every signal is waited for;
//! - **no deadlock** when each connection (sender, receiver, channel)
//!   buffers at most [`VerifyOptions::slots`] messages and a step that
//!   receives and forwards needs its incoming message and room for the
//!   outgoing one at the same time, as NCCL's primitives do (deadlock
//!   freedom with `k` slots implies it for any more);
//! - **no race** on one-sided accesses or between channels of one rank:
//!   conflicting accesses must be ordered by signal/wait or messages
//!   (vector clocks), nobody touches a rank's buffers before that rank has
//!   entered the collective, and nothing is left touching them after it
//!   returns;
//! - **well-formedness**: peers in range and not the rank itself, slices
//!   inside their buffers, operand lengths that agree, no operand that
//!   partially overlaps the slice the step writes (also through in-place
//!   aliasing), no read of data never written, no write to the input.
//!
//! On success it returns the bytes each rank sent and received, and
//! whether the program reduces in the canonical order
//! ([`crate::canon`]): every element's value is tracked with its order,
//! up to commutativity (`a ⊕ b` is `b ⊕ a` bit for bit; `(a ⊕ b) ⊕ c` is
//! not `a ⊕ (b ⊕ c)`), and [`Report::departure`] names the first
//! reduction that left the canonical tree and reached an output.

mod race;
mod state;
mod sym;

use crate::ir::Program;
use oxccl_core::Result;

/// Verification settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VerifyOptions {
    /// Messages a connection buffers before a send blocks (at least 1).
    /// The default, 2, is what the ring needs; NCCL's connections have 8.
    pub slots: usize,
    /// Run with input and output aliased as NCCL's in-place calls have them.
    pub in_place: bool,
}

impl Default for VerifyOptions {
    fn default() -> VerifyOptions {
        VerifyOptions { slots: 2, in_place: false }
    }
}

/// What a verified program does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// Bytes each rank sends (messages, and data it puts into or others get
    /// from its buffers).
    pub sent_bytes: Vec<u64>,
    /// Bytes each rank receives.
    pub recv_bytes: Vec<u64>,
    /// Two-sided messages exchanged.
    pub messages: u64,
    /// Steps executed.
    pub steps: u64,
    /// `None` when every output element is reduced in the canonical order
    /// ([`crate::canon`]; always so for collectives that do not reduce);
    /// else the first reduction that left it, as it reaches an output
    /// (outputs in rank, then element order).
    pub departure: Option<Departure>,
}

/// A reduction that leaves the canonical order ([`crate::canon`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Departure {
    /// The rank that runs it.
    pub rank: usize,
    /// Its channel.
    pub channel: usize,
    /// Its step in the channel.
    pub step: usize,
    /// The input index of the first element it combines out of order.
    pub element: usize,
    /// The first output (rank, element) its value reaches.
    pub output: (usize, usize),
    /// All of the above in words, with the operands' ranks and the tree.
    pub message: String,
}

impl std::fmt::Display for Departure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl Report {
    /// The largest number of bytes any rank sends.
    pub fn max_sent(&self) -> u64 {
        self.sent_bytes.iter().copied().max().unwrap_or(0)
    }
    /// Whether every output element is reduced in the canonical order.
    pub fn is_canonical(&self) -> bool {
        self.departure.is_none()
    }
    /// Bytes sent by all ranks together.
    pub fn total_sent(&self) -> u64 {
        self.sent_bytes.iter().sum()
    }
}

/// Verifies `program` out of place and, when it claims to be in-place
/// safe ([`Program::in_place`]), in place too. Returns the out-of-place
/// report, whose [`departure`](Report::departure) is the in-place run's
/// where only that one leaves the canonical order (aliasing can change
/// what a step reads).
pub fn verify(program: &Program) -> Result<Report> {
    let mut report = verify_with(program, &VerifyOptions::default())?;
    if program.in_place {
        let aliased = verify_with(program, &VerifyOptions { in_place: true, ..VerifyOptions::default() }).map_err(
            |e| match e {
                oxccl_core::Error::InvalidProgram(m) => {
                    oxccl_core::Error::program(format!("{m} (in place; the program claims in-place safety)"))
                }
                other => other,
            },
        )?;
        if report.departure.is_none()
            && let Some(mut d) = aliased.departure
        {
            d.message.push_str(" (in place)");
            report.departure = Some(d);
        }
    }
    Ok(report)
}

/// Verifies `program` in one mode.
pub fn verify_with(program: &Program, opts: &VerifyOptions) -> Result<Report> {
    state::Machine::new(program, opts)?.run()
}
