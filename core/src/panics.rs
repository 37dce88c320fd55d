//! Contained panics: turning a caught panic payload into words.
//!
//! Every boundary where taskhost calls code it does not own (a producer's
//! start, read, cancel or `done`; a listener; a tool) catches unwinding and
//! reports the panic's message. The payload is taken by value so the `Box`
//! itself can never be mistaken for the payload (which reads as
//! `unknown panic` and loses the message).

use std::any::Any;

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
}
