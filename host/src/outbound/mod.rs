//! Outbound HTTP for plugins granted `[producer.grants.http]`: the grant
//! ([`grant`]) and the checks every request passes before it connects
//! ([`guard`]). No wasmtime here: the `wasi:http` glue is
//! `plugin::host::http`, which sends through these checks.
//!
//! Invariants: nothing connects before the method, the origin and the
//! address it connects to were checked; the secrets of a grant's credentials
//! are only written into outgoing request headers, never handed to a guest.

pub mod grant;
pub mod guard;
pub mod own_listeners;
