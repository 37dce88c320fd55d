//! The warm keeper's message encoding, tested natively.

use super::*;

#[test]
fn a_plan_survives_the_round_trip() {
    let args = [c"0".to_owned(), c"/bin/sh".to_owned(), c"--".to_owned(), c"".to_owned()];
    let env = [c"A=1".to_owned(), c"B=x=y".to_owned(), c"C=".to_owned()];
    let message = encode(&args, &env).unwrap();
    let (got_args, got_env) = decode(&message).unwrap();
    assert_eq!(got_args, ["0", "/bin/sh", "--", ""].map(OsString::from));
    let want: BTreeMap<OsString, OsString> =
        [("A", "1"), ("B", "x=y"), ("C", "")].into_iter().map(|(k, v)| (k.into(), v.into())).collect();
    assert_eq!(got_env, want);
    // A message cut short, or with a stray entry, is refused.
    assert!(decode(&message[..message.len() - 2]).is_none());
    let mut extra = message.clone();
    extra.extend_from_slice(b"D=2\0");
    assert!(decode(&extra).is_none());
    let huge = [CString::new(vec![b'x'; MAX_PLAN_BYTES]).unwrap()];
    assert!(encode(&huge, &[]).is_none());
}
