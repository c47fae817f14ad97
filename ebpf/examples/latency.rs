fn main() {
    match swiftlet_ebpf::Sensors::load(&swiftlet_ebpf::SensorConfig::default()) {
        Ok(s) => println!("loaded: {s:?}"),
        Err(e) => {
            let mut err: &dyn std::error::Error = &e;
            println!("error: {err}");
            while let Some(src) = err.source() { println!("  caused by: {src}"); err = src; }
        }
    }
}
