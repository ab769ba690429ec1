//! ZeRO-1/2/3 sharded mixed-precision AdamW on oxccl, with its own byte and
//! memory accounting, to show what sharding costs on the wire.
//!
//! With Ψ parameters over N data-parallel ranks (Rajbhandari et al., SC'20):
//! DDP all-reduces gradients (2Ψ moved per step by a ring); ZeRO-1 and
//! ZeRO-2 reduce-scatter gradients and all-gather updated parameters (the
//! same 2Ψ); ZeRO-3 also gathers parameters before each layer's forward
//! and backward (3Ψ: 1.5×). Model-state memory per rank drops from 16Ψ
//! bytes to 4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N and 16Ψ/N. `oxccl-zero-bench` measures
//! both on a real model; the tests assert them.
//!
//! # Quick start
//!
//! ```
//! use oxccl::Communicator;
//! use oxccl_zero::{AdamW, LayerSpec, Stage, Tensor, Zero};
//!
//! let comms = Communicator::init_threads(2).unwrap();
//! let layers = vec![LayerSpec { name: "fc".into(), tensors: vec![Tensor::new("fc.w", 6), Tensor::new("fc.b", 3)] }];
//! std::thread::scope(|s| {
//!     for c in &comms {
//!         let layers = &layers;
//!         s.spawn(move || {
//!             let mut z = Zero::<f32>::new(c, Stage::Zero3, layers, &[0.5; 9], AdamW::default()).unwrap();
//!             let w = z.params(0).unwrap().to_vec(); // gathered for the forward
//!             z.release(0).unwrap(); // and freed
//!             let grads: Vec<f32> = w.iter().map(|x| x * 2.0).collect();
//!             z.params(0).unwrap(); // gathered again for the backward
//!             z.release(0).unwrap();
//!             z.reduce_grads(0, &grads).unwrap(); // reduce-scattered in the background
//!             z.step().unwrap();
//!             assert!(z.full_params().unwrap()[0] < 0.5);
//!         });
//!     }
//! });
//! ```
//!
//! # Thread safety
//!
//! A [`Zero`] belongs to one rank's training loop (`&mut self` throughout);
//! it borrows its rank's [`oxccl::Communicator`] and issues collectives on
//! it in a fixed order (bucket by bucket, never "whichever gradient is
//! ready first"), so every rank issues the same sequence.
//!
//! # What it owns
//!
//! Every buffer it holds is charged to its [`Meter`] while it lives
//! (buffers lent to collectives in flight included), so the memory figures
//! are measured. Checkpoints ([`Zero::save`], [`Zero::load`]) are written in
//! canonical unpadded order and load at any stage and world size.

mod adam;
mod ckpt;
mod layout;
mod mem;
mod optim;
mod param;
mod stage;

pub use adam::AdamW;
pub use ckpt::Header;
pub use layout::{Bucket, LayerSpec, Layout, Tensor};
pub use mem::{Meter, peak_rss};
pub use optim::{StepReport, Zero, same_on_every_rank, traffic};
pub use param::Param;
pub use stage::{Stage, StateBytes};
