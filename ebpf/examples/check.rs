//! Says whether the sensors load on this node and, if not, why (the error an operator
//! would see in the agent's log): `cargo run -p swiftlet-ebpf --example check`.

use std::process::ExitCode;

use swiftlet_ebpf::{SensorConfig, Sensors};

fn main() -> ExitCode {
    match Sensors::load(&SensorConfig::default()) {
        Ok(sensors) => {
            for program in sensors.program_stats() {
                println!(
                    "{:24} tp_btf/{:32} verified insns {:?}, jited {} B",
                    program.program, program.tracepoint, program.verified_instructions, program.jited_bytes
                );
            }
            println!("the eBPF sensors load and attach on this node");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("the eBPF sensors cannot run here: {error}");
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                eprintln!("  caused by: {cause}");
                source = cause.source();
            }
            ExitCode::FAILURE
        }
    }
}
