//! Tests that load a real (or a missing) libibverbs, and one that needs an
//! HCA (`OXCCL_IB_TEST_HCA=mlx5_0 cargo test -p oxccl-transport --lib
//! rdma::ibv -- --ignored`).

use super::*;
use crate::rdma::env::choose_gid;
use crate::rdma::verbs::{Completion, Connect, LinkLayer, Opcode, QpState, RecvWr, SendWr, Status, WcOpcode};
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

#[test]
fn a_missing_library_is_unavailable_naming_the_path() {
    let path = "/nonexistent/oxccl-test/libibverbs.so.1";
    let u = open_devices(&HcaFilter::default(), Some(path)).err().expect("a missing library cannot open devices");
    assert_eq!(u.kind, UnavailableKind::Library);
    assert!(u.reason.contains(path) && u.reason.contains("OXCCL_IBVERBS_LIB"), "{u}");
    let e: Error = u.into();
    assert!(matches!(e, Error::Unavailable(_)));
}

#[test]
fn a_library_without_verbs_is_unavailable_naming_the_symbol() {
    let u = open_devices(&HcaFilter::default(), Some("libc.so.6")).err().expect("libc has no verbs");
    assert_eq!(u.kind, UnavailableKind::Symbol, "{u}");
    assert!(u.reason.contains("ibv_fork_init@IBVERBS_1.1") && u.reason.contains("libc.so.6"), "{u}");
}

#[test]
fn disabled_is_unavailable() {
    let opts = IbOptions { disable: true, ..IbOptions::default() };
    let u = open(&opts).err().expect("disabled");
    assert_eq!(u.kind, UnavailableKind::Disabled);
    assert!(u.reason.contains("OXCCL_IB_DISABLE"), "{u}");
}

#[test]
fn symbols_are_versioned() {
    for (name, ver) in symbols() {
        let want = if name.contains("comp_channel") { "IBVERBS_1.0" } else { "IBVERBS_1.1" };
        assert_eq!(*ver, want, "{name}");
    }
    assert!(symbols().iter().any(|(n, _)| *n == "ibv_query_port"));
}

/// The real library, if installed (else a skip, a failure where
/// `OXCCL_REQUIRE_IBVERBS` is set): on a machine without kernel RDMA or
/// without devices, an `Unavailable` in words; with devices, devices.
#[test]
fn the_installed_library_opens_or_says_why() {
    if let Err(u) = load::load(Some(DEFAULT_LIB)) {
        oxccl_skip::skip_or_fail("OXCCL_REQUIRE_IBVERBS", format!("{u} (apt-get install libibverbs1)"));
        return;
    }
    // Loading twice gives the same library (loaded once per path).
    let a = load::load(Some(DEFAULT_LIB)).map(|l| l as *const _).ok();
    assert_eq!(a, load::load(None).map(|l| l as *const _).ok());
    match open_devices(&HcaFilter::default(), None) {
        Ok(devs) => {
            assert!(!devs.is_empty());
            for d in &devs {
                let ports = d.ports().expect("ports of an opened device");
                eprintln!("{}: {ports:?}", d.name());
                assert!(ports.iter().any(|p| p.state == PortState::Active));
            }
        }
        Err(u) => {
            eprintln!("unavailable ({:?}): {u}", u.kind);
            assert!(!u.reason.is_empty());
            match u.kind {
                UnavailableKind::DeviceList => {
                    assert!(u.reason.contains("ibv_get_device_list"), "{u}");
                    if u.reason.contains("Function not implemented") {
                        assert!(
                            u.reason.starts_with(
                                "the kernel has no RDMA support (ibv_get_device_list: Function not implemented;"
                            ),
                            "{u}"
                        );
                    }
                }
                UnavailableKind::NoDevice => assert!(u.reason.contains("no RDMA device"), "{u}"),
                UnavailableKind::NotUsable => assert!(u.reason.contains("no usable RDMA device"), "{u}"),
                k => panic!("unexpected kind {k:?}: {u}"),
            }
        }
    }
    // A filter that admits nothing: Filtered where devices exist, the same
    // reason as above where none do.
    let none = HcaFilter::parse("=no_such_hca").unwrap();
    if let Err(u) = open_devices(&none, None) {
        assert_ne!(u.kind, UnavailableKind::Library);
        if u.kind == UnavailableKind::Filtered {
            assert!(u.reason.contains("OXCCL_IB_HCA==no_such_hca"), "{u}");
        }
    }
}

/// Memory an HCA reads and writes: only raw pointers while it may.
struct Buf(Vec<u8>);

impl Buf {
    fn addr(&mut self) -> u64 {
        self.0.as_mut_ptr() as u64
    }
}

fn poll_until(cq: &Arc<dyn Cq>, want: usize, what: &str) -> Vec<Completion> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    while got.len() < want {
        let left = want - got.len();
        cq.poll(&mut got, left).expect("poll");
        assert!(Instant::now() < deadline, "{what}: {} of {want} completions after 10 s: {got:?}", got.len());
    }
    for c in &got {
        assert_eq!(c.status, Status::Success, "{what}: {c:?}");
    }
    got
}

fn readable(fd: RawFd, ms: i32) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, ms) == 1 }
}

/// Loopback on a real HCA: two QPs on one port connected to each other, an
/// RDMA WRITE_WITH_IMM and an RDMA READ, data and completions checked;
/// run without `OXCCL_IB_TEST_HCA`, a failure that says to set it.
#[test]
#[ignore = "needs an RDMA HCA: set OXCCL_IB_TEST_HCA=mlx5_0"]
fn hca_loopback_write_imm_and_read() {
    // Run (under --ignored) without its HCA, it fails: it has tested nothing.
    let hca = std::env::var("OXCCL_IB_TEST_HCA")
        .unwrap_or_else(|_| panic!("OXCCL_IB_TEST_HCA is not set: set it to the HCA to test (mlx5_0)"));
    let opts = IbOptions::from_lookup(|n| std::env::var(n).ok()).expect("OXCCL_IB_* variables");
    let filter = HcaFilter::parse(&format!("={hca}")).unwrap();
    let devs = open_devices(&filter, opts.ibverbs_lib.as_deref()).unwrap_or_else(|u| panic!("{hca}: {u}"));
    let dev = &devs[0];
    assert_eq!(dev.name(), hca);
    let port = dev.ports().unwrap().into_iter().find(|p| p.state == PortState::Active).expect("an active port");
    let gid = choose_gid(&hca, &port, opts.gid_index).expect("a GID");
    eprintln!(
        "{hca} port {} ({}, lid {}, mtu code {}, {:.0} Gb/s), GID {} = {} ({:?})",
        port.num,
        port.link_layer,
        port.lid,
        port.active_mtu,
        port.bw * 8e-9,
        gid.index,
        crate::rdma::env::gid_to_string(&gid.gid),
        gid.kind
    );

    let cq = dev.create_cq(64).unwrap();
    let caps = QpCaps { max_send_wr: 16, max_recv_wr: 16, max_inline: 0 };
    let mut a = dev.create_qp(&cq, caps, port.num).unwrap();
    let mut b = dev.create_qp(&cq, caps, port.num).unwrap();
    assert_eq!((a.state(), b.state()), (QpState::Init, QpState::Init));
    let early = SendWr { wr_id: 0, op: Opcode::Write, local: 0, len: 0, lkey: 0, remote: 0, rkey: 0, signaled: true };
    assert!(matches!(a.post_send(&[early]), Err(Error::InvalidUsage(_))), "post_send before RTS is refused");

    const N: usize = 8192;
    let mut src = Buf((0..N).map(|i| (i * 7 + 3) as u8).collect());
    let mut dst = Buf(vec![0u8; N]);
    let mut back = Buf(vec![0u8; N]);
    // SAFETY: the three buffers outlive their registrations (deregistered
    // below) and are read only after the completions that say they landed.
    let (ms, md, mb) = unsafe {
        (
            dev.reg_mr(src.addr(), N, Access::LOCAL).unwrap(),
            dev.reg_mr(dst.addr(), N, Access::ALL).unwrap(),
            dev.reg_mr(back.addr(), N, Access::LOCAL).unwrap(),
        )
    };
    let conn = |remote_qpn: u32| Connect {
        remote_qpn,
        remote_psn: 0,
        local_psn: 0,
        remote_lid: port.lid,
        remote_gid: gid.gid,
        use_gid: port.link_layer == LinkLayer::Ethernet,
        gid_index: gid.index,
        mtu: port.active_mtu,
        timeout: opts.timeout,
        retry_cnt: opts.retry_cnt,
        rnr_retry: opts.rnr_retry,
        min_rnr_timer: 12,
        sl: opts.sl,
        traffic_class: opts.tc,
        max_rd_atomic: 1,
    };
    let (qa, qb) = (a.qpn(), b.qpn());
    a.connect(&conn(qb)).unwrap();
    b.connect(&conn(qa)).unwrap();
    assert_eq!((a.state(), b.state()), (QpState::Rts, QpState::Rts));

    // WRITE_WITH_IMM a → b, with the completion channel armed.
    cq.arm().unwrap();
    b.post_recv(&[RecvWr { wr_id: 100 }]).unwrap();
    let imm = 0xdead_beef;
    let write = SendWr {
        wr_id: 1,
        op: Opcode::WriteImm(imm),
        local: ms.addr + 16,
        len: 4096,
        lkey: ms.lkey,
        remote: md.addr + 128,
        rkey: md.rkey,
        signaled: true,
    };
    a.post_send(&[write]).unwrap();
    assert!(readable(cq.fd().expect("a channel"), 10_000), "no completion event within 10 s");
    cq.arm().unwrap();
    let mut got = poll_until(&cq, 2, "write with immediate");
    got.sort_by_key(|c| c.wr_id);
    assert_eq!((got[0].wr_id, got[0].opcode, got[0].qpn), (1, WcOpcode::Write, qa), "{got:?}");
    assert_eq!((got[1].wr_id, got[1].opcode, got[1].qpn), (100, WcOpcode::RecvImm, qb), "{got:?}");
    assert_eq!((got[1].imm, got[1].byte_len), (Some(imm), 4096), "{got:?}");
    {
        let (s, d) = (&src.0, &dst.0);
        assert!(d[..128].iter().all(|&x| x == 0) && d[128 + 4096..].iter().all(|&x| x == 0));
        assert_eq!(&d[128..128 + 4096], &s[16..16 + 4096]);
    }

    // READ b's landed bytes back into a's third buffer.
    let read = SendWr {
        wr_id: 2,
        op: Opcode::Read,
        local: mb.addr,
        len: 4096,
        lkey: mb.lkey,
        remote: md.addr + 128,
        rkey: md.rkey,
        signaled: true,
    };
    a.post_send(&[read]).unwrap();
    let got = poll_until(&cq, 1, "read");
    assert_eq!((got[0].wr_id, got[0].opcode, got[0].qpn), (2, WcOpcode::Read, qa), "{got:?}");
    assert_eq!(&back.0[..4096], &src.0[16..16 + 4096]);

    // An unsignaled write followed by a signaled one: one completion.
    let w = |wr_id, signaled, off: u64| SendWr {
        wr_id,
        op: Opcode::Write,
        local: ms.addr + off,
        len: 512,
        lkey: ms.lkey,
        remote: md.addr + off,
        rkey: md.rkey,
        signaled,
    };
    a.post_send(&[w(3, false, 0), w(4, true, 512)]).unwrap();
    let got = poll_until(&cq, 1, "two writes");
    assert_eq!(got[0].wr_id, 4);
    assert_eq!(&dst.0[..1024], &src.0[..1024]);

    while let Some(ev) = dev.async_event() {
        eprintln!("async event: {ev}");
    }
    a.fail().unwrap();
    assert_eq!(a.state(), QpState::Error);
    drop((a, b));
    for m in [ms, md, mb] {
        dev.dereg_mr(&m).unwrap();
    }
    assert!(dev.dereg_mr(&ms).is_err(), "a second dereg is refused");
}
