//! How long the verifier takes to prove big programs.
#![allow(missing_docs)] // criterion_group! generates an undocumented function

use criterion::{Criterion, criterion_group, criterion_main};
use oxccl_algo::algos::{Algorithm, BuildOptions, build};
use oxccl_algo::verify::verify;
use oxccl_algo::{CollKind, Collective};

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("verify_256_ranks_1M");
    g.sample_size(10);
    for (algo, kind) in [
        (Algorithm::Ring, CollKind::AllReduce),
        (Algorithm::Tree, CollKind::AllReduce),
        (Algorithm::Rhd, CollKind::AllReduce),
        (Algorithm::TwoShot, CollKind::AllReduce),
        (Algorithm::Ring, CollKind::AllGather),
        (Algorithm::Pairwise, CollKind::AllToAll),
    ] {
        let coll = Collective::new(kind, 256, 1_000_003);
        let p = build(algo, &coll, &BuildOptions::default()).unwrap();
        g.bench_function(format!("{algo}_{kind}"), |b| b.iter(|| verify(&p).unwrap()));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
