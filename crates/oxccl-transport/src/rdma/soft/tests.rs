//! The RC rules the soft HCA keeps, each checked directly against the
//! verbs seam (in memory and over TCP).

use super::{SoftDevice, SoftOptions};
use crate::rdma::verbs::{
    Access, AsyncEvent, Completion, Connect, Cq, Device, Opcode, Qp, QpCaps, QpState, RecvWr, SendWr, Status, WcOpcode,
};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

struct End {
    dev: Arc<SoftDevice>,
    cq: Arc<dyn Cq>,
    qp: Box<dyn Qp>,
}

fn caps() -> QpCaps {
    QpCaps { max_send_wr: 8, max_recv_wr: 8, max_inline: 0 }
}

fn conn(to: &End, timeout: u8, retry: u8, rnr_retry: u8) -> Connect {
    let port = &to.dev.ports().unwrap()[0];
    Connect {
        remote_qpn: to.qp.qpn(),
        remote_psn: 100,
        local_psn: 100,
        remote_lid: port.lid,
        remote_gid: port.gids[1].gid,
        use_gid: true,
        gid_index: 1,
        mtu: 5,
        timeout,
        retry_cnt: retry,
        rnr_retry,
        min_rnr_timer: 1,
        sl: 0,
        traffic_class: 0,
        max_rd_atomic: 1,
    }
}

fn end(opts: SoftOptions, cq_depth: u32) -> End {
    let dev = SoftDevice::open(Ipv4Addr::LOCALHOST, opts).unwrap();
    let cq = dev.create_cq(cq_depth).unwrap();
    let qp = dev.create_qp(&cq, caps(), 1).unwrap();
    End { dev, cq, qp }
}

/// Two connected ends (timeout exponent, retries, RNR retries).
fn pair(opts: SoftOptions, t: (u8, u8, u8)) -> (End, End) {
    let (mut a, mut b) = (end(opts, 64), end(opts, 64));
    let ca = conn(&b, t.0, t.1, t.2);
    let cb = conn(&a, t.0, t.1, t.2);
    a.qp.connect(&ca).unwrap();
    b.qp.connect(&cb).unwrap();
    (a, b)
}

fn wait_wc(cq: &Arc<dyn Cq>, within: Duration) -> Completion {
    let end = Instant::now() + within;
    let mut v = Vec::new();
    loop {
        match cq.poll(&mut v, 1) {
            Ok(1) => return v[0],
            Ok(_) => {}
            Err(e) => panic!("poll: {e}"),
        }
        assert!(Instant::now() < end, "no completion within {within:?}");
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn reg(dev: &SoftDevice, b: &mut [u8], a: Access) -> crate::rdma::verbs::Mr {
    // SAFETY: every buffer registered in these tests outlives its QPs' use
    // (the tests wait for completions before dropping them).
    unsafe { dev.reg_mr(b.as_mut_ptr() as u64, b.len(), a).unwrap() }
}

fn write(id: u64, op: Opcode, src: &crate::rdma::verbs::Mr, off: u64, len: u32, dst: (u64, u32)) -> SendWr {
    SendWr { wr_id: id, op, local: src.addr + off, len, lkey: src.lkey, remote: dst.0, rkey: dst.1, signaled: true }
}

fn both_paths(f: impl Fn(SoftOptions)) {
    f(SoftOptions::default());
    f(SoftOptions { tcp_only: true, ..SoftOptions::default() });
}

#[test]
fn write_with_imm_and_read_land_in_order() {
    both_paths(|o| {
        let (mut a, mut b) = pair(o, (14, 7, 7));
        let mut src: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
        let mut dst = vec![0u8; 100_000];
        let smr = reg(&a.dev, &mut src, Access::ALL);
        let dmr = reg(&b.dev, &mut dst, Access::ALL);
        b.qp.post_recv(&[RecvWr { wr_id: 77 }]).unwrap();
        let wrs = [
            write(1, Opcode::Write, &smr, 0, 50_000, (dmr.addr, dmr.rkey)),
            write(2, Opcode::WriteImm(0xabcd), &smr, 50_000, 50_000, (dmr.addr + 50_000, dmr.rkey)),
        ];
        a.qp.post_send(&wrs).unwrap();
        let r = wait_wc(&b.cq, Duration::from_secs(10));
        assert_eq!(
            (r.wr_id, r.status, r.opcode, r.imm, r.byte_len),
            (77, Status::Success, WcOpcode::RecvImm, Some(0xabcd), 50_000)
        );
        // The immediate's completion comes after every byte before it.
        assert_eq!(dst, src, "placement in order on one QP");
        assert_eq!(wait_wc(&a.cq, Duration::from_secs(5)).wr_id, 1);
        assert_eq!(wait_wc(&a.cq, Duration::from_secs(5)).wr_id, 2);
        // READ back into a fresh buffer.
        let mut back = vec![0u8; 4096];
        let bmr = reg(&a.dev, &mut back, Access::LOCAL);
        let rd = SendWr { op: Opcode::Read, ..write(3, Opcode::Read, &bmr, 0, 4096, (dmr.addr + 1000, dmr.rkey)) };
        a.qp.post_send(&[rd]).unwrap();
        let c = wait_wc(&a.cq, Duration::from_secs(5));
        assert_eq!((c.wr_id, c.status, c.opcode, c.byte_len), (3, Status::Success, WcOpcode::Read, 4096));
        assert_eq!(back[..], src[1000..5096]);
    });
}

#[test]
fn rnr_retries_then_succeeds_or_gives_up() {
    both_paths(|o| {
        // Forever (7): a receive posted later lets the write through.
        let (mut a, mut b) = pair(o, (14, 7, 7));
        let mut src = vec![5u8; 64];
        let mut dst = vec![0u8; 64];
        let smr = reg(&a.dev, &mut src, Access::ALL);
        let dmr = reg(&b.dev, &mut dst, Access::ALL);
        a.qp.post_send(&[write(1, Opcode::WriteImm(1), &smr, 0, 64, (dmr.addr, dmr.rkey))]).unwrap();
        std::thread::sleep(Duration::from_millis(30));
        let mut v = Vec::new();
        assert_eq!(a.cq.poll(&mut v, 4).unwrap(), 0, "no completion while the peer is not ready");
        b.qp.post_recv(&[RecvWr { wr_id: 9 }]).unwrap();
        assert_eq!(wait_wc(&a.cq, Duration::from_secs(5)).status, Status::Success);
        assert_eq!(wait_wc(&b.cq, Duration::from_secs(5)).imm, Some(1));
        // Two retries: RNR_RETRY_EXC_ERR, and what follows is flushed.
        let (mut a, b) = pair(o, (14, 7, 2));
        let smr = reg(&a.dev, &mut src, Access::ALL);
        let dmr = reg(&b.dev, &mut dst, Access::ALL);
        let w = write(1, Opcode::WriteImm(1), &smr, 0, 64, (dmr.addr, dmr.rkey));
        a.qp.post_send(&[w, SendWr { wr_id: 2, ..w }]).unwrap();
        let c = wait_wc(&a.cq, Duration::from_secs(5));
        assert_eq!((c.wr_id, c.status), (1, Status::RnrRetryExc));
        assert_eq!(wait_wc(&a.cq, Duration::from_secs(5)).status, Status::WrFlush);
        assert_eq!(a.qp.state(), QpState::Error);
        a.qp.post_send(&[SendWr { wr_id: 3, ..w }]).unwrap();
        assert_eq!(wait_wc(&a.cq, Duration::from_secs(5)).status, Status::WrFlush, "later requests are flushed");
    });
}

#[test]
fn bad_rkey_fails_both_queue_pairs() {
    both_paths(|o| {
        let (mut a, mut b) = pair(o, (14, 7, 7));
        let mut src = vec![5u8; 64];
        let mut dst = vec![0u8; 64];
        let smr = reg(&a.dev, &mut src, Access::ALL);
        let dmr = reg(&b.dev, &mut dst, Access::REMOTE_WRITE);
        b.qp.post_recv(&[RecvWr { wr_id: 9 }]).unwrap();
        let w = write(1, Opcode::Write, &smr, 0, 64, (dmr.addr, dmr.rkey ^ 0x4000));
        a.qp.post_send(&[w, SendWr { wr_id: 2, rkey: dmr.rkey, ..w }]).unwrap();
        let c = wait_wc(&a.cq, Duration::from_secs(5));
        assert_eq!((c.wr_id, c.status), (1, Status::RemAccess));
        assert_eq!(wait_wc(&a.cq, Duration::from_secs(5)).status, Status::WrFlush);
        // The responder failed too: its receive is flushed, and its device says why.
        let r = wait_wc(&b.cq, Duration::from_secs(5));
        assert_eq!((r.wr_id, r.status), (9, Status::WrFlush));
        assert_eq!(b.qp.state(), QpState::Error);
        assert_eq!(b.dev.async_event(), Some(AsyncEvent::QpError(b.qp.qpn())));
        assert_eq!(dst, vec![0u8; 64], "nothing placed");
        // Out of bounds and missing rights are access errors too.
        for (addr, len, op) in [(dmr.addr + 1, 64u32, Opcode::Write), (dmr.addr, 8, Opcode::Read)] {
            let (mut a, mut b) = pair(o, (14, 7, 7));
            let smr = reg(&a.dev, &mut src, Access::ALL);
            let dmr = reg(&b.dev, &mut dst, Access::REMOTE_WRITE);
            let _ = &mut b;
            let off = addr - dmr.addr.min(addr);
            a.qp.post_send(&[write(1, op, &smr, 0, len, (dmr.addr + off, dmr.rkey))]).unwrap();
            assert_eq!(wait_wc(&a.cq, Duration::from_secs(5)).status, Status::RemAccess, "{op:?} at +{off}");
        }
    });
}

#[test]
fn queues_refuse_what_verbs_refuse() {
    let mut a = end(SoftOptions::default(), 2);
    let mut src = vec![0u8; 64];
    let smr = reg(&a.dev, &mut src, Access::ALL);
    let w = write(1, Opcode::Write, &smr, 0, 64, (0, 0));
    let e = a.qp.post_send(&[w]).unwrap_err().to_string();
    assert!(e.contains("before") || e.contains("RTS"), "{e}");
    let mut b = end(SoftOptions::default(), 2);
    let (ca, cb) = (conn(&b, 14, 7, 7), conn(&a, 14, 7, 7));
    a.qp.connect(&ca).unwrap();
    b.qp.connect(&cb).unwrap();
    let mut dst = vec![0u8; 64];
    let dmr = reg(&b.dev, &mut dst, Access::ALL);
    let w = SendWr { signaled: false, ..write(1, Opcode::Write, &smr, 0, 64, (dmr.addr, dmr.rkey)) };
    // Unsignaled requests are never retired: the ninth does not fit.
    a.qp.post_send(&[w; 8]).unwrap();
    let e = a.qp.post_send(&[w]).unwrap_err().to_string();
    assert!(e.contains("send queue is full") && e.contains("max_send_wr 8"), "{e}");
    // A CQ of 2 entries overflows on the third completion: CQ_ERR.
    for i in 0..3 {
        b.qp.post_recv(&[RecvWr { wr_id: i }]).unwrap();
    }
    b.qp.fail().unwrap(); // three flushed receives into a CQ of 2
    let t = Instant::now();
    let mut v = Vec::new();
    let err = loop {
        match b.cq.poll(&mut v, 0) {
            Err(e) => break e.to_string(),
            Ok(_) => assert!(t.elapsed() < Duration::from_secs(5), "the CQ never overflowed"),
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    assert!(err.contains("overflowed") && err.contains("CQ_ERR"), "{err}");
    assert_eq!(b.dev.async_event(), Some(AsyncEvent::CqErr));
}

#[test]
fn a_dead_link_exhausts_retries() {
    both_paths(|o| {
        // timeout 10: 4.2 ms per try, 3 retries: about 17 ms.
        let (mut a, b) = pair(o, (10, 3, 7));
        let mut src = vec![1u8; 64];
        let mut dst = vec![0u8; 64];
        let smr = reg(&a.dev, &mut src, Access::ALL);
        let dmr = reg(&b.dev, &mut dst, Access::ALL);
        b.dev.port_down();
        std::thread::sleep(Duration::from_millis(20));
        let t = Instant::now();
        a.qp.post_send(&[write(1, Opcode::Write, &smr, 0, 64, (dmr.addr, dmr.rkey))]).unwrap();
        let c = wait_wc(&a.cq, Duration::from_secs(5));
        assert_eq!(c.status, Status::RetryExc);
        assert!(t.elapsed() >= Duration::from_millis(16), "{:?}: before retries were exhausted", t.elapsed());
        assert_eq!(b.dev.async_event(), Some(AsyncEvent::PortErr(1)));
    });
}

#[test]
fn shuffle_poisons_before_placing_and_late_read_reads_late() {
    // Shuffled placement still lands every byte by the completion.
    let o = SoftOptions { shuffle: true, ..SoftOptions::default() };
    let (mut a, mut b) = pair(o, (14, 7, 7));
    let mut src: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let mut dst = vec![0u8; 300_000];
    let smr = reg(&a.dev, &mut src, Access::ALL);
    let dmr = reg(&b.dev, &mut dst, Access::ALL);
    b.qp.post_recv(&[RecvWr { wr_id: 1 }]).unwrap();
    a.qp.post_send(&[write(1, Opcode::WriteImm(0), &smr, 0, 300_000, (dmr.addr, dmr.rkey))]).unwrap();
    wait_wc(&b.cq, Duration::from_secs(10));
    assert_eq!(dst, src);
    // Late read: a source changed right after posting is what travels.
    let o = SoftOptions { late_read: Some(Duration::from_millis(50)), ..SoftOptions::default() };
    let (mut a, mut b) = pair(o, (14, 7, 7));
    let mut src = vec![1u8; 64];
    let mut dst = vec![0u8; 64];
    let smr = reg(&a.dev, &mut src, Access::ALL);
    let dmr = reg(&b.dev, &mut dst, Access::ALL);
    b.qp.post_recv(&[RecvWr { wr_id: 1 }]).unwrap();
    a.qp.post_send(&[write(1, Opcode::WriteImm(0), &smr, 0, 64, (dmr.addr, dmr.rkey))]).unwrap();
    // SAFETY: the soft HCA reads the source only after 50 ms; writing it
    // now through the pointer models a buggy caller reusing it too early.
    unsafe { std::ptr::write_bytes(smr.addr as *mut u8, 2, 64) };
    wait_wc(&b.cq, Duration::from_secs(5));
    assert_eq!(dst, vec![2u8; 64], "the late read sent the reused buffer");
    drop(src);
}
