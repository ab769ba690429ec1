//! The environment is read once, in `Config`: a field a program sets wins
//! over the variable a transport used to read on its own (`OXCCL_NSOCKS`,
//! `OXCCL_SOCKET_IFNAME`, `OXCCL_IB_*`), and a variable still counts where
//! the field is left unset. Each case runs in a child process of this test
//! binary (an `#[ignore]`d helper) whose environment sets the variables,
//! so this process's environment is never changed.

use oxccl::config::{IbOptions, IbProvider, RdmaOptions};
use oxccl::{Communicator, Config, Kind};
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs the ignored test `name` of this binary with `envs` set: (whether
/// it passed, its stdout, its stderr). A child still running after 120 s
/// is killed and reported as failed.
fn child(name: &str, envs: &[(&str, &str)]) -> (bool, String, String) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--ignored", "--exact", name, "--nocapture", "--test-threads=1"])
        .env_remove("OXCCL_SECRET")
        .env_remove("OXCCL_SECRET_FILE")
        .env_remove("OXCCL_DEBUG")
        .env_remove("OXCCL_DEBUG_FILE")
        .env("OXCCL_TIMEOUT", "30")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut c = cmd.spawn().expect("spawn the test binary");
    let (mut out, mut err) = (c.stdout.take().unwrap(), c.stderr.take().unwrap());
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let ok = loop {
        if let Some(st) = c.try_wait().unwrap() {
            break st.success();
        }
        if start.elapsed() > Duration::from_secs(120) {
            let _ = c.kill();
            let _ = c.wait();
            break false;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    (ok && out.contains("1 passed"), out, err)
}

/// Sockets this process has open.
fn sockets() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| l.to_string_lossy().starts_with("socket:"))
        .count()
}

/// Sockets per TCP connection between two ranks of this process: rank 0
/// sends to rank 1 once (the first use opens one connection, each of its
/// sockets seen at both ends), counted from the process's sockets.
fn tcp_streams(comms: &[Communicator]) -> usize {
    assert_eq!(comms[0].transport_to(1), Some(Kind::Tcp));
    let before = sockets();
    std::thread::scope(|s| {
        s.spawn(|| comms[0].send(&[7u32; 16], 1).expect("send"));
        let mut got = [0u32; 16];
        comms[1].recv(&mut got, 0).expect("recv");
        assert_eq!(got, [7; 16]);
    });
    let opened = sockets() - before;
    assert_eq!(opened % 2, 0, "{opened} sockets opened: each stream has two ends in this process");
    opened / 2
}

fn tcp_over_lo() -> Config {
    Config { transport: Some(Kind::Tcp), socket_ifname: Some("lo".into()), ..Config::default() }
}

/// Run with `OXCCL_NSOCKS=4`, `OXCCL_SOCKET_IFNAME` naming no interface and
/// `OXCCL_IB_DISABLE=1`.
#[test]
#[ignore = "helper of config_fields_win_over_transport_variables (needs its environment)"]
fn config_child() {
    assert_eq!(std::env::var("OXCCL_NSOCKS").as_deref(), Ok("4"), "run through the parent test");

    // Sockets per TCP connection: the field, else the variable.
    let comms = Communicator::init_threads_with(2, Config { nsocks: Some(2), ..tcp_over_lo() }).unwrap();
    let set = tcp_streams(&comms);
    drop(comms);
    let comms = Communicator::init_threads_with(2, tcp_over_lo()).unwrap();
    let unset = tcp_streams(&comms);
    drop(comms);
    println!("STREAMS set={set} unset={unset}");

    // The interface: the field picks the bootstrap's and TCP's, else the
    // variable (which names none here).
    let id = tcp_over_lo().unique_id().unwrap();
    assert!(id.addr().ip().is_loopback(), "{}", id.addr());
    let e = oxccl::unique_id().unwrap_err().to_string();
    assert!(e.contains("oxccl_no_such_if"), "{e}");
    let Err(e) = Communicator::init_threads_with(2, Config { transport: Some(Kind::Tcp), ..Config::default() }) else {
        panic!("init on the variable's interface, which does not exist");
    };
    let e = e.to_string();
    assert!(e.contains("oxccl_no_such_if"), "{e}");
    println!("IFNAME set=lo unset=refused");

    // RDMA: settings in the Config are used as they are (the software HCA,
    // not disabled), else the variables (OXCCL_IB_DISABLE=1).
    let soft =
        RdmaOptions { ib: IbOptions { provider: IbProvider::Soft, ..IbOptions::default() }, ..Default::default() };
    let rdma = Config { transport: Some(Kind::Rdma), socket_ifname: Some("lo".into()), ..Config::default() };
    let comms = Communicator::init_threads_with(2, Config { rdma: Some(soft), ..rdma.clone() }).unwrap();
    assert_eq!(comms[0].transport_to(1), Some(Kind::Rdma));
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                let mut v = [c.rank() as f32 + 1.0; 1000];
                c.all_reduce_in_place(&mut v, oxccl::ReduceOp::Sum).unwrap();
                assert_eq!(v, [3.0; 1000]);
            });
        }
    });
    drop(comms);
    let Err(e) = Communicator::init_threads_with(2, rdma) else { panic!("RDMA was disabled by the variable") };
    let e = e.to_string();
    assert!(e.contains("OXCCL_IB_DISABLE"), "{e}");
    println!("RDMA set=soft unset=disabled");
}

#[test]
fn config_fields_win_over_transport_variables() {
    let (ok, out, err) = child(
        "config_child",
        &[("OXCCL_NSOCKS", "4"), ("OXCCL_SOCKET_IFNAME", "oxccl_no_such_if"), ("OXCCL_IB_DISABLE", "1")],
    );
    assert!(ok, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("STREAMS set=2 unset=4"), "{out}");
    assert!(out.contains("IFNAME set=lo unset=refused"), "{out}");
    assert!(out.contains("RDMA set=soft unset=disabled"), "{out}");
}

/// What `with_launch_secret` warns without a secret (README: "a warning
/// says so").
const NO_SECRET: &str = "no OXCCL_SECRET or OXCCL_SECRET_FILE";

/// A one-rank job under torchrun's variables, as the parent set them.
#[test]
#[ignore = "helper of the launcher warning tests (needs their environment)"]
fn launch_child() {
    assert!(std::env::var("RANK").is_ok(), "run through the parent test");
    let comm = Communicator::from_env().unwrap();
    assert_eq!((comm.rank(), comm.size()), (0, 1));
}

/// `with_launch_secret` alone, as tools call it before their own init.
#[test]
#[ignore = "helper of the launcher warning tests (needs their environment)"]
fn secret_child() {
    let id = oxccl::UniqueId::for_env("127.0.0.1:1".parse().unwrap(), "job");
    assert_eq!(oxccl::with_launch_secret(id, |_| None).unwrap(), id);
}

/// torchrun's variables for a one-rank job on a free local port.
fn torchrun() -> Vec<(&'static str, String)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    vec![
        ("RANK", "0".into()),
        ("WORLD_SIZE", "1".into()),
        ("MASTER_ADDR", "127.0.0.1".into()),
        ("MASTER_PORT", port.to_string()),
    ]
}

#[test]
fn launcher_without_a_secret_warns_on_stderr() {
    let vars = torchrun();
    let envs: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (ok, out, err) = child("launch_child", &envs);
    assert!(ok, "stdout:\n{out}\nstderr:\n{err}");
    assert!(err.contains(NO_SECRET) && err.contains("anyone who knows both can join"), "stderr:\n{err}");
    assert_eq!(err.matches(NO_SECRET).count(), 1, "warned once:\n{err}");

    let (ok, out, err) = child("secret_child", &[]);
    assert!(ok, "stdout:\n{out}\nstderr:\n{err}");
    assert!(err.contains(NO_SECRET), "with_launch_secret called before any communicator:\n{err}");

    // With a secret there is nothing to warn about.
    let envs = [envs, vec![("OXCCL_SECRET", "a passphrase")]].concat();
    let (ok, out, err) = child("launch_child", &envs);
    assert!(ok, "stdout:\n{out}\nstderr:\n{err}");
    assert!(!err.contains(NO_SECRET), "stderr:\n{err}");
}

/// Under torchrun, its store listens on `MASTER_PORT` (held here the whole
/// time): a native program without `OXCCL_ADDR` rendezvouses on a port
/// derived from it instead of failing with "Address already in use"; and
/// an `OXCCL_ADDR` that is taken is an error saying which variable to set.
#[test]
fn under_torchrun_the_store_port_is_left_to_the_store() {
    let store = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = store.local_addr().unwrap().port().to_string();
    let mut envs = vec![
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", port.as_str()),
        ("OXCCL_SECRET", "a passphrase"),
    ];
    let (ok, out, err) = child("launch_child", &envs);
    assert!(ok, "stdout:\n{out}\nstderr:\n{err}");
    let taken = format!("127.0.0.1:{port}");
    envs.push(("OXCCL_ADDR", taken.as_str()));
    let (ok, out, err) = child("launch_child", &envs);
    let all = format!("{out}{err}");
    assert!(!ok, "{all}");
    assert!(
        all.contains("Address already in use")
            && all.contains(&format!("came from OXCCL_ADDR={taken}"))
            && all.contains("set OXCCL_ADDR=host:port to a free port"),
        "{all}"
    );
    drop(store);
}
