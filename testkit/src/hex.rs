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
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trips_and_refuses_what_is_not_hex() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(super::decode(&super::encode(&bytes)), Some(bytes));
        for bad in ["abc", "zz", "é1", "0g"] {
            assert_eq!(super::decode(bad), None, "{bad:?}");
        }
    }
}
