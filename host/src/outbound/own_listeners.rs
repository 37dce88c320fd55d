//! The addresses this process serves MCP on (`serve --http`, the dashboard
//! on the same port), so the guard can refuse a plugin's request to the
//! host's own MCP port whatever address reaches it.
//!
//! Invariants: a listener is registered for as long as it accepts (the
//! [`Registration`] it returns unregisters it when dropped). A listener on
//! an unspecified address (`0.0.0.0`, `[::]`) is reached through every
//! address of this machine: loopback and each interface's address, read
//! when a request is checked (interfaces come and go), a public one
//! included. The check is on the address a request would connect to.

use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;

static LISTENERS: Mutex<Vec<SocketAddr>> = Mutex::new(Vec::new());

/// A listener registered by [`register`], unregistered when dropped.
#[derive(Debug)]
pub struct Registration {
    address: SocketAddr,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut listeners = LISTENERS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = listeners.iter().position(|a| *a == self.address) {
            listeners.swap_remove(at);
        }
    }
}

/// Registers `address` (as bound: its real port) as one MCP is served on.
pub fn register(address: SocketAddr) -> Registration {
    LISTENERS.lock().unwrap_or_else(|e| e.into_inner()).push(address);
    Registration { address }
}

/// The MCP listener that a connection to `target` would reach, if any.
pub fn serving_at(target: SocketAddr) -> Option<SocketAddr> {
    let target_ip = canonical(target.ip());
    let listeners: Vec<SocketAddr> = LISTENERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|l| l.port() == target.port())
        .copied()
        .collect();
    if listeners.is_empty() {
        return None;
    }
    let mut own_addresses: Option<Vec<IpAddr>> = None;
    listeners.into_iter().find(|listener| {
        let ip = canonical(listener.ip());
        if !ip.is_unspecified() {
            return ip == target_ip;
        }
        // `[::]` also accepts IPv4 (dual stack, Linux's default).
        let v4_only = ip.is_ipv4();
        if target_ip.is_loopback() || target_ip.is_unspecified() {
            return !v4_only || target_ip.is_ipv4();
        }
        let own = own_addresses.get_or_insert_with(interface_addresses);
        own.contains(&target_ip) && (!v4_only || target_ip.is_ipv4())
    })
}

/// Every address of this machine's interfaces (none if they cannot be read).
pub fn interface_addresses() -> Vec<IpAddr> {
    let Ok(interfaces) = nix::ifaddrs::getifaddrs() else {
        tracing::warn!("cannot list this machine's interface addresses");
        return Vec::new();
    };
    interfaces
        .filter_map(|interface| interface.address)
        .filter_map(|address| {
            if let Some(v4) = address.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                address.as_sockaddr_in6().map(|v6| canonical(IpAddr::V6(v6.ip())))
            }
        })
        .collect()
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_is_reached_through_the_addresses_it_accepts_on() {
        let port = 65_001;
        let at = |ip: &str| SocketAddr::new(ip.parse().unwrap(), port);
        assert_eq!(serving_at(at("127.0.0.1")), None);
        let v4 = register(at("0.0.0.0"));
        assert_eq!(serving_at(at("127.0.0.1")), Some(at("0.0.0.0")));
        assert_eq!(serving_at(at("::ffff:127.0.0.1")), Some(at("0.0.0.0")), "IPv4-mapped");
        assert_eq!(serving_at(at("::1")), None, "0.0.0.0 accepts no IPv6");
        assert_eq!(serving_at(SocketAddr::new("127.0.0.1".parse().unwrap(), port + 1)), None, "another port");
        for ip in interface_addresses() {
            if ip.is_ipv4() {
                assert_eq!(serving_at(SocketAddr::new(ip, port)), Some(at("0.0.0.0")), "{ip}");
            }
        }
        drop(v4);
        assert_eq!(serving_at(at("127.0.0.1")), None, "unregistered when dropped");
        let _v6 = register(at("::"));
        assert_eq!(serving_at(at("::1")), Some(at("::")));
        assert_eq!(serving_at(at("127.0.0.1")), Some(at("::")), "dual stack");
        let _one = register(SocketAddr::new("192.0.2.7".parse().unwrap(), port + 2));
        assert!(serving_at(SocketAddr::new("192.0.2.7".parse().unwrap(), port + 2)).is_some());
        assert_eq!(serving_at(SocketAddr::new("127.0.0.1".parse().unwrap(), port + 2)), None);
    }
}
