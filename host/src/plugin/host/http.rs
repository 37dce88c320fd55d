//! `wasi:http/outgoing-handler` and `wasi:http/types` (wasmtime-wasi-http)
//! for plugins granted `[producer.grants.http]`: its `send_request` hook
//! runs every request through [`crate::outbound::guard`] and sends it with
//! the instance's client, within the grant's bounds.
//!
//! Invariants: a request is refused before any connection when the store is
//! not granted, the task's request budget is spent, its method or origin is
//! not granted, or its address is one a plugin may not reach; every refusal
//! and every bound reached is an `internal-error` whose text says what
//! happened and what grants it, for the guest to show the model. A
//! credential of the origin replaces any header of the same name the guest
//! set. Redirects are not followed: the guest's next request is checked
//! again. The guest's `request-options` may shorten the wait for the
//! response (`first-byte-timeout`) and between body chunks
//! (`between-bytes-timeout`), never lengthen it past the grant's
//! `request_timeout_ms`; a wait it shortened ends in
//! `connection-read-timeout`, the standard code.

use std::future::Future;

use http_body_util::BodyExt as _;
use wasmtime::component::{HasData, Linker};
use wasmtime_wasi_http::{Error, WasiBody, WasiHttpCtxView, WasiHttpHooks};

use crate::outbound::guard::{Target, check_request};
use crate::plugin::resources::{HttpCapability, HttpHooks};

/// Adds `wasi:http/outgoing-handler` and `wasi:http/types` on `view`.
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    view: fn(&mut T) -> WasiHttpCtxView<'_>,
) -> anyhow::Result<()> {
    use wasmtime_wasi_http::p2::bindings::http;
    http::outgoing_handler::add_to_linker::<T, HttpData>(linker, view)?;
    http::types::add_to_linker::<T, HttpData>(linker, &Default::default(), view)?;
    Ok(())
}

struct HttpData;

impl HasData for HttpData {
    type Data<'a> = WasiHttpCtxView<'a>;
}

fn refused(text: String) -> Error {
    Error::InternalError(Some(text))
}

type Sent = Box<dyn Future<Output = Result<(), Error>> + Send>;
type Sending = Box<dyn Future<Output = Result<(http::Response<WasiBody>, Sent), Error>> + Send>;

impl HttpHooks {
    /// Checks `request` now (in the guest's call, before anything is sent):
    /// the grant, the budget, the method, the origin, an IP literal.
    fn admit(&mut self, request: &http::Request<WasiBody>) -> Result<(HttpCapability, Target), Error> {
        let Some(capability) = self.capability.clone() else {
            return Err(refused(format!(
                "taskhost refused the request: plugin {} is not granted HTTP access (its [[producer]] entry \
                 needs [producer.grants.http] with the origins it may reach)",
                self.plugin
            )));
        };
        let grant = &capability.grant;
        if self.requests >= grant.max_requests_per_task {
            return Err(refused(format!(
                "taskhost refused the request: this task already made {} requests, its bound \
                 ([producer.grants.http] max_requests_per_task)",
                grant.max_requests_per_task
            )));
        }
        let target =
            Target::of(request.uri()).map_err(|why| refused(format!("taskhost refused the request: {why}")))?;
        check_request(grant, request.method(), &target).map_err(refused)?;
        self.requests += 1;
        Ok((capability, target))
    }
}

impl WasiHttpHooks for HttpHooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<wasmtime_wasi_http::RequestOptions>,
        _fut: Sent,
    ) -> Sending {
        let admitted = self.admit(&request);
        let plugin = self.plugin.clone();
        Box::new(async move {
            let (capability, target) = admitted?;
            tracing::debug!(plugin = &*plugin, origin = %target, method = %request.method(), "plugin HTTP request");
            let response = send(&capability, &target, request, options.unwrap_or_default()).await?;
            Ok((response, Box::new(async { Ok(()) }) as Sent))
        })
    }
}

/// Sends an admitted request: its body collected within the bound, the
/// origin's credentials added, the response's headers and body bounded.
async fn send(
    capability: &HttpCapability,
    target: &Target,
    request: http::Request<WasiBody>,
    options: wasmtime_wasi_http::RequestOptions,
) -> Result<http::Response<WasiBody>, Error> {
    let grant = &capability.grant;
    let (parts, body) = request.into_parts();
    let body = http_body_util::Limited::new(body, usize::try_from(grant.max_request_bytes).unwrap_or(usize::MAX))
        .collect()
        .await
        .map_err(|e| {
            refused(format!(
                "taskhost refused the request: its body is over {} bytes ([producer.grants.http] \
                 max_request_bytes) or could not be read: {e}",
                grant.max_request_bytes
            ))
        })?
        .to_bytes();
    let mut headers = parts.headers;
    // reqwest writes Host from the URL.
    headers.remove(http::header::HOST);
    for credential in &grant.credentials {
        if credential.origin.matches(target.https, &target.host, target.port) {
            headers.insert(credential.header.clone(), credential.value.clone());
        }
    }
    let url = parts.uri.to_string();
    let deadline = tokio::time::Instant::now() + grant.request_timeout;
    let timeout = grant.request_timeout;
    let sent = capability.client.request(parts.method, &url).headers(headers).body(body).timeout(timeout).send();
    let first_byte = GuestWait::new(deadline, options.first_byte_timeout);
    let response = tokio::time::timeout_at(first_byte.until(), sent)
        .await
        .map_err(|_| first_byte.expired(target, timeout))?
        .map_err(|e| failed(target, timeout, &e))?;

    let header_bytes: u64 = response.headers().iter().map(|(k, v)| (k.as_str().len() + v.len()) as u64).sum();
    if header_bytes > grant.max_header_bytes {
        return Err(refused(format!(
            "the response from {target} has {header_bytes} bytes of headers, over the bound of {} \
             ([producer.grants.http] max_header_bytes)",
            grant.max_header_bytes
        )));
    }
    let mut builder = http::Response::builder().status(response.status()).version(response.version());
    for (name, value) in response.headers() {
        builder = builder.header(name, value);
    }
    let limit = grant.max_response_bytes;
    if response.content_length().is_some_and(|length| length > limit) {
        return Err(over_body_bound(target, limit));
    }
    let target = target.clone();
    let chunks = futures::stream::unfold((response, 0u64, false), move |(mut response, read, done)| {
        let target = target.clone();
        async move {
            if done {
                return None;
            }
            let between_bytes = GuestWait::new(deadline, options.between_bytes_timeout);
            let chunk = match tokio::time::timeout_at(between_bytes.until(), response.chunk()).await {
                Err(_) => Err(between_bytes.expired(&target, timeout)),
                Ok(Err(e)) => Err(failed(&target, timeout, &e)),
                Ok(Ok(None)) => return None,
                Ok(Ok(Some(chunk))) => Ok(chunk),
            };
            match chunk {
                Ok(chunk) => {
                    let read = read + chunk.len() as u64;
                    if read > limit {
                        Some((Err(over_body_bound(&target, limit)), (response, read, true)))
                    } else {
                        Some((Ok(http_body::Frame::data(chunk)), (response, read, false)))
                    }
                }
                Err(error) => Some((Err(error), (response, read, true))),
            }
        }
    });
    let body: WasiBody = http_body_util::StreamBody::new(chunks).boxed_unsync();
    builder.body(body).map_err(|e| refused(format!("the response from {}: {e}", parts.uri)))
}

/// One wait of a request: until the grant's deadline, or sooner if the
/// guest asked for less.
struct GuestWait {
    grant_deadline: tokio::time::Instant,
    guest_deadline: Option<tokio::time::Instant>,
}

impl GuestWait {
    fn new(grant_deadline: tokio::time::Instant, guest_timeout: Option<std::time::Duration>) -> Self {
        let guest_deadline = guest_timeout
            .and_then(|timeout| tokio::time::Instant::now().checked_add(timeout))
            .filter(|at| *at < grant_deadline);
        Self { grant_deadline, guest_deadline }
    }

    fn until(&self) -> tokio::time::Instant {
        self.guest_deadline.unwrap_or(self.grant_deadline)
    }

    /// The error of a wait that ran out: the guest's own timeout is the
    /// standard code; the grant's bound says which bound it was.
    fn expired(&self, target: &Target, grant_timeout: std::time::Duration) -> Error {
        match self.guest_deadline {
            Some(_) => Error::ConnectionReadTimeout,
            None => timed_out(target, grant_timeout),
        }
    }
}

fn over_body_bound(target: &Target, limit: u64) -> Error {
    refused(format!(
        "the response body from {target} is over {limit} bytes, its bound ([producer.grants.http] max_response_bytes)"
    ))
}

fn timed_out(target: &Target, timeout: std::time::Duration) -> Error {
    refused(format!(
        "the request to {target} took longer than {} ms, its bound ([producer.grants.http] request_timeout_ms)",
        timeout.as_millis()
    ))
}

/// A send error: the time bound, or the error with its causes (the
/// guard's refusal is one).
fn failed(target: &Target, timeout: std::time::Duration, error: &reqwest::Error) -> Error {
    if error.is_timeout() {
        return timed_out(target, timeout);
    }
    let mut text = format!("the request to {target} failed");
    let mut certificate_refused = false;
    let mut source: Option<&dyn std::error::Error> = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        certificate_refused |= matches!(tls_error_in(cause), Some(rustls::Error::InvalidCertificate(_)));
        source = cause.source();
    }
    if certificate_refused {
        text.push_str(&format!(
            " (the TLS certificate of {target} is not one this host trusts: only certificates signed by the \
             system's CA roots are, as the server's SSL_CERT_FILE and SSL_CERT_DIR or else the system store \
             name them)"
        ));
    }
    refused(text)
}

/// The rustls error `cause` is or wraps: it travels inside io::Errors,
/// whose `source` skips the error they wrap.
fn tls_error_in<'e>(mut cause: &'e (dyn std::error::Error + 'static)) -> Option<&'e rustls::Error> {
    loop {
        if let Some(tls) = cause.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        cause = cause.downcast_ref::<std::io::Error>()?.get_ref()?;
    }
}
