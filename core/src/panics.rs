//! Contained panics: a call into a producer that cannot unwind into the
//! host ([`contained`]), and a caught panic payload in words.
//!
//! Every boundary where taskhost calls code it does not own (a producer's
//! start, read, cancel or `done`; a listener; a tool) catches unwinding and
//! reports the panic's message. The payload is taken by value so the `Box`
//! itself can never be mistaken for the payload (which reads as
//! `unknown panic` and loses the message).

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt as _;

/// Awaits a call into a producer (its start, prepare, read, cancel or input
/// write), containing a panic as the error `the producer panicked:
/// <message>`: the caller gets an error to report, never an unwinding task.
pub async fn contained<T>(call: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    AssertUnwindSafe(call)
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| Err(anyhow::anyhow!("the producer panicked: {}", panic_message(panic))))
}

/// The message of a caught panic: the `&str` or `String` it was raised with,
/// or a placeholder for other payloads.
pub fn panic_message(payload: Box<dyn Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(message) => *message,
        Err(payload) => match payload.downcast::<&'static str>() {
            Ok(message) => (*message).to_string(),
            Err(_) => "a panic without a message".to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_of_both_payload_kinds_survive() {
        let caught = std::panic::catch_unwind(|| panic!("static words")).unwrap_err();
        assert_eq!(panic_message(caught), "static words");
        let n = 7;
        let caught = std::panic::catch_unwind(|| panic!("formatted {n}")).unwrap_err();
        assert_eq!(panic_message(caught), "formatted 7");
        let caught = std::panic::catch_unwind(|| std::panic::panic_any(42_u8)).unwrap_err();
        assert_eq!(panic_message(caught), "a panic without a message");
    }

    #[tokio::test]
    async fn a_contained_call_returns_its_result_or_names_the_panic() {
        assert_eq!(contained(async { Ok(3) }).await.unwrap(), 3);
        let error = contained(async { Err::<(), _>(anyhow::anyhow!("refused")) }).await.unwrap_err();
        assert_eq!(format!("{error:#}"), "refused");
        let panicked = contained(async {
            if true {
                panic!("boom");
            }
            Ok(())
        })
        .await
        .unwrap_err();
        assert_eq!(panicked.to_string(), "the producer panicked: boom");
    }
}
