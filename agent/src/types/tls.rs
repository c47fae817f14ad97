//! TLS cipher suites named as Go's `crypto/tls` names them (`tlsCipherSuites`), with
//! their IANA code points: the names config validation accepts and the suites the
//! server enables.

/// TLS cipher suites accepted in `tlsCipherSuites`: the Go names of the suites rustls
/// implements, with their IANA code points. Go's CBC, RSA key exchange, 3DES and RC4
/// suites have no rustls implementation and are rejected.
pub const TLS_CIPHER_SUITES: [(&str, u16); 11] = [
    ("TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", 0xc02b),
    ("TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", 0xc02c),
    ("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", 0xc02f),
    ("TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", 0xc030),
    ("TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256", 0xcca8),
    ("TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305", 0xcca8),
    ("TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256", 0xcca9),
    ("TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305", 0xcca9),
    // TLS 1.3 suites are accepted by name (as by the kubelet) but, as in Go, always on.
    ("TLS_AES_128_GCM_SHA256", 0x1301),
    ("TLS_AES_256_GCM_SHA384", 0x1302),
    ("TLS_CHACHA20_POLY1305_SHA256", 0x1303),
];

/// The IANA code point of a cipher suite named as in Go's `crypto/tls`.
#[must_use]
pub fn tls_cipher_suite_id(name: &str) -> Option<u16> {
    TLS_CIPHER_SUITES.iter().find(|(known, _)| *known == name).map(|&(_, id)| id)
}
