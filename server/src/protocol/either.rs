//! Values that are a string or something else (a list, an object): `content` (text or parts),
//! `stop` (one or several), `tool_choice` (a mode or a named function). serde's untagged enums
//! buffer the value and try each shape, so an error below (an unknown field of a content part)
//! comes back as "did not match any variant", without its path; [`deserialize`] instead lets the
//! JSON say which shape it is and reads that one in place, keeping the path and the reason.

use std::fmt;
use std::marker::PhantomData;

use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{Deserialize, Deserializer, Error, MapAccess, SeqAccess, Visitor};

/// A value that is a string or another shape.
pub trait StringOr: Sized {
    /// The other shape (a list or an object).
    type Other;
    /// What the value may be, for the error of anything else ("a string or a list of parts").
    const EXPECTING: &'static str;
    /// The value of a string.
    fn from_string(text: String) -> Self;
    /// The value of the other shape.
    fn from_other(other: Self::Other) -> Self;
}

/// Reads a [`StringOr`] value (use it in the type's `Deserialize` implementation).
pub fn deserialize<'de, T, D>(deserializer: D) -> Result<T, D::Error>
where
    T: StringOr,
    T::Other: Deserialize<'de>,
    D: Deserializer<'de>,
{
    deserializer.deserialize_any(StringOrVisitor(PhantomData))
}

struct StringOrVisitor<T>(PhantomData<T>);

impl<'de, T> Visitor<'de> for StringOrVisitor<T>
where
    T: StringOr,
    T::Other: Deserialize<'de>,
{
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(T::EXPECTING)
    }

    fn visit_str<E: Error>(self, text: &str) -> Result<T, E> {
        Ok(T::from_string(text.to_string()))
    }

    fn visit_string<E: Error>(self, text: String) -> Result<T, E> {
        Ok(T::from_string(text))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<T, A::Error> {
        T::Other::deserialize(SeqAccessDeserializer::new(seq)).map(T::from_other)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::Other::deserialize(MapAccessDeserializer::new(map)).map(T::from_other)
    }
}

/// Implements `Deserialize` for a [`StringOr`] type.
macro_rules! deserialize_string_or {
    ($type:ty) => {
        impl<'de> serde::Deserialize<'de> for $type {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                $crate::protocol::either::deserialize(deserializer)
            }
        }
    };
}
pub(crate) use deserialize_string_or;
