//! Checkpoints in canonical, unpadded order: loadable by any stage at any
//! world size.
//!
//! Format (little-endian): the 8 bytes `OXZERO\0\x01`, a `u64` header
//! length, a JSON [`Header`], then per tensor in canonical order its fp32
//! master weights, first moments and second moments (`numel` each).
//! Padding is never written.

use crate::adam::AdamW;
use crate::layout::Tensor;
use crate::optim::{Zero, held};
use crate::param::Param;
use crate::stage::Stage;
use oxccl::{Error, ReduceOp, Result};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

const MAGIC: &[u8; 8] = b"OXZERO\0\x01";

/// What a checkpoint says about itself.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Header {
    /// Steps taken when it was saved.
    pub step: u64,
    /// The hyperparameters then.
    pub adam: AdamW,
    /// The stage that saved it.
    pub stage: Stage,
    /// The ranks that saved it.
    pub nranks: usize,
    /// The working parameters' type.
    pub param_type: String,
    /// The tensors, in canonical order.
    pub tensors: Vec<Tensor>,
}

fn io(path: &Path, what: &str, e: std::io::Error) -> Error {
    Error::invalid(format!("oxccl-zero checkpoint {}: {what}: {e}", path.display()))
}

impl<P: Param> Zero<'_, P> {
    /// Writes a checkpoint to `path` (rank 0 writes; every rank calls it:
    /// sharded states are gathered bucket by bucket). An error on rank 0
    /// is every rank's error.
    pub fn save(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let (stage, step, adam) = (self.stage(), self.steps(), *self.adam());
        let (comm, layout, state) = self.parts();
        let rank = comm.rank();
        let mut out = None;
        let mut failure = None;
        if rank == 0 {
            match File::create(path) {
                Ok(f) => out = Some(BufWriter::new(f)),
                Err(e) => failure = Some(io(path, "cannot create it", e)),
            }
        }
        let mut ok = [u8::from(failure.is_none())];
        comm.all_reduce_in_place(&mut ok, ReduceOp::Min)?;
        if ok[0] == 0 {
            return Err(failure.unwrap_or_else(|| {
                Error::invalid(format!(
                    "rank {rank}: oxccl-zero: rank 0 could not create checkpoint {}",
                    path.display()
                ))
            }));
        }
        let header = Header {
            step,
            adam,
            stage,
            nranks: comm.size(),
            param_type: P::NAME.into(),
            tensors: layout.tensors().cloned().collect(),
        };
        let mut write = |bytes: &[u8]| -> Result<()> {
            match out.as_mut() {
                Some(w) => w.write_all(bytes).map_err(|e| io(path, "cannot write it", e)),
                None => Ok(()),
            }
        };
        let json = serde_json::to_vec(&header).map_err(|e| Error::Internal(e.to_string()))?;
        write(MAGIC)?;
        write(&(json.len() as u64).to_le_bytes())?;
        write(&json)?;
        for (b, st) in layout.buckets.iter().zip(state.iter_mut()) {
            // DDP holds them whole: written as they are, not copied.
            let parts: Vec<Cow<'_, [f32]>> = st
                .optim()
                .into_iter()
                .map(|v| {
                    if stage == Stage::Ddp {
                        return Ok(Cow::Borrowed(v.as_slice()));
                    }
                    let mut whole = vec![0f32; b.padded];
                    comm.all_gather(v, &mut whole)?;
                    Ok(Cow::Owned(whole))
                })
                .collect::<Result<_>>()?;
            for (t, off) in &b.tensors {
                for p in &parts {
                    write(bytemuck_f32(&p[*off..off + t.numel]))?;
                }
            }
        }
        if let Some(w) = out.as_mut() {
            w.flush().map_err(|e| io(path, "cannot write it", e))?;
        }
        comm.barrier()
    }

    /// Loads a checkpoint any stage at any world size saved (every rank
    /// reads `path`, which must be visible to all). The tensors must match
    /// this optimizer's by name and size; the hyperparameters stay this
    /// optimizer's. Nothing changes on error.
    pub fn load(&mut self, path: impl AsRef<Path>) -> Result<Header> {
        let path = path.as_ref();
        let stage = self.stage();
        let (comm, layout, state) = self.parts();
        let rank = comm.rank();
        if state.iter().any(|s| s.busy()) {
            return Err(Error::invalid(format!(
                "rank {rank}: oxccl-zero load: collectives are in flight (load between steps)"
            )));
        }
        let mut r = BufReader::new(File::open(path).map_err(|e| io(path, "cannot open it", e))?);
        let mut magic = [0u8; 8];
        r.read_exact(&mut magic).map_err(|e| io(path, "cannot read it", e))?;
        if &magic != MAGIC {
            return Err(Error::invalid(format!(
                "oxccl-zero checkpoint {}: not an oxccl-zero checkpoint (bad magic)",
                path.display()
            )));
        }
        let mut len = [0u8; 8];
        r.read_exact(&mut len).map_err(|e| io(path, "cannot read its header", e))?;
        let len = u64::from_le_bytes(len);
        if len > 1 << 30 {
            return Err(Error::invalid(format!("oxccl-zero checkpoint {}: header of {len} bytes", path.display())));
        }
        let mut json = vec![0u8; len as usize];
        r.read_exact(&mut json).map_err(|e| io(path, "cannot read its header", e))?;
        let header: Header = serde_json::from_slice(&json)
            .map_err(|e| Error::invalid(format!("oxccl-zero checkpoint {}: bad header: {e}", path.display())))?;
        let mine: Vec<&Tensor> = layout.tensors().collect();
        if header.tensors.len() != mine.len() {
            return Err(Error::invalid(format!(
                "rank {rank}: oxccl-zero checkpoint {} has {} tensors, the model {}",
                path.display(),
                header.tensors.len(),
                mine.len()
            )));
        }
        if let Some((a, b)) = header.tensors.iter().zip(&mine).find(|(a, b)| a != *b) {
            return Err(Error::invalid(format!(
                "rank {rank}: oxccl-zero checkpoint {}: it has tensor {:?} of {} elements where the model has {:?} of {}",
                path.display(),
                a.name,
                a.numel,
                b.name,
                b.numel
            )));
        }
        // Read everything first, so that a short file changes nothing.
        let mut loaded = Vec::with_capacity(layout.buckets.len());
        for b in &layout.buckets {
            let mut parts = [vec![0f32; b.padded], vec![0f32; b.padded], vec![0f32; b.padded]];
            for (t, off) in &b.tensors {
                for p in parts.iter_mut() {
                    let mut bytes = vec![0u8; t.numel * 4];
                    r.read_exact(&mut bytes).map_err(|e| io(path, &format!("tensor {:?} is cut short", t.name), e))?;
                    for (d, c) in p[*off..off + t.numel].iter_mut().zip(bytes.chunks_exact(4)) {
                        *d = f32::from_le_bytes(c.try_into().expect("4 bytes"));
                    }
                }
            }
            loaded.push(parts);
        }
        for ((b, st), parts) in layout.buckets.iter().zip(state.iter_mut()).zip(loaded) {
            let held = held(stage, b, rank);
            for (dst, src) in st.optim().into_iter().zip(&parts) {
                dst.copy_from_slice(&src[held.clone()]);
            }
            st.refresh(held);
            // Stages 1–2 refreshed only their slice of the whole parameters.
            if matches!(stage, Stage::Zero1 | Stage::Zero2) {
                comm.all_gather_in_place(st.whole().expect("stages 1-2 hold whole parameters"))?;
            }
        }
        self.set_steps(header.step);
        Ok(header)
    }
}

fn bytemuck_f32(v: &[f32]) -> &[u8] {
    // Little-endian machines only (x86-64, aarch64): the in-memory bytes
    // are the file's.
    const { assert!(cfg!(target_endian = "little")) };
    bytemuck::cast_slice(v)
}
