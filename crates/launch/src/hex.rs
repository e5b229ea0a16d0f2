//! Bytes as lowercase hex and back: how unique ids cross environment variables and text protocols.

/// `bytes` as two lowercase hex digits each.
pub fn encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes `hex` spells, or `None` when it is not an even number of hex digits (it may come from a
/// peer: never a panic).
pub fn decode(hex: &str) -> Option<Vec<u8>> {
    let digits = hex.as_bytes();
    if digits.len() % 2 != 0 {
        return None;
    }
    // Digit by digit: `u8::from_str_radix` would also take a sign (`+a`).
    let nibble = |d: u8| char::from(d).to_digit(16);
    digits
        .chunks(2)
        .map(|pair| Some(((nibble(pair[0])? << 4) | nibble(pair[1])?) as u8))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trips_and_refuses_what_is_not_hex() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(super::decode(&super::encode(&bytes)), Some(bytes));
        for bad in ["abc", "zz", "é1", "0g", "+a", "-0"] {
            assert_eq!(super::decode(bad), None, "{bad:?}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1024))]

        /// Any bytes round-trip; any text decodes to half its length in bytes or to `None` (never a
        /// panic), and what decodes is exactly the hex its bytes encode to.
        #[test]
        fn any_bytes_round_trip_and_any_text_is_an_answer(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
            text in "([0-9a-fA-F+-]{2}){0,8}|.{0,16}",
        ) {
            proptest::prop_assert_eq!(super::decode(&super::encode(&bytes)), Some(bytes));
            if let Some(decoded) = super::decode(&text) {
                proptest::prop_assert_eq!(super::encode(&decoded), text.to_ascii_lowercase());
            }
        }
    }
}
