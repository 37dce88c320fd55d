//! The one way taskhost (and its tests) build HTTP clients.
//!
//! reqwest is compiled with rustls but without a crypto provider
//! (`rustls-no-provider`), so that the binary carries exactly one: ring.
//! Building a client before a provider is installed panics, so every client
//! comes from [`builder`], which installs ring first if nothing else has.

/// A reqwest client builder, safe to build whatever ran first.
pub fn builder() -> reqwest::ClientBuilder {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may win the race; either install is ring.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    reqwest::Client::builder()
}

/// A client with reqwest's defaults.
pub fn client() -> reqwest::Client {
    builder().build().expect("a default reqwest client builds")
}
