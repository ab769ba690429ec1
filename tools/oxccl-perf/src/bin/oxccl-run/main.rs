//! oxccl-run: starts N ranks of a program on this machine.

fn main() {
    eprintln!("oxccl-run: not yet");
    std::process::exit(2);
}
