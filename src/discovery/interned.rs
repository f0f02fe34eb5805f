//! Interned strings for discovery documents. A document of 20 000 resources repeats a few values
//! endlessly (verbs, scope, group and version names, each kind twice: the resource's and its
//! `status`'s); parsed as `String`s that is over 600 000 small heap blocks, and in a wasm VM the
//! allocator's per-block overhead then costs as much as the strings (`bench/mem_probe.py`). Parsed
//! inside [`interning`], equal strings of one document share one block.
//!
//! The pool lives only while a document is parsed: nothing outlives the documents that use it, so
//! a server that leaves frees its strings and no pool has to be pruned.

use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;
use std::ops::Deref;
use std::rc::Rc;

/// An immutable, cheaply cloned string (`Rc<str>`): compares, hashes, orders and serializes as
/// the text it holds.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Str(Rc<str>);

thread_local! {
    static POOL: RefCell<Option<HashSet<Rc<str>>>> = const { RefCell::new(None) };
    static EMPTY: Rc<str> = Rc::from("");
}

/// Runs `f` (a parse) with a fresh pool: every [`Str`] deserialized meanwhile is shared with any
/// equal one deserialized before it in the same run. Nests (the inner run has its own pool).
pub fn interning<T>(f: impl FnOnce() -> T) -> T {
    let outer = POOL.with(|p| p.borrow_mut().replace(HashSet::new()));
    let out = f();
    POOL.with(|p| *p.borrow_mut() = outer);
    out
}

impl Str {
    /// `s`, shared with an equal string from the pool of a running [`interning`] (if any).
    pub fn intern(s: &str) -> Str {
        if s.is_empty() {
            return Str::default();
        }
        POOL.with(|p| match p.borrow_mut().as_mut() {
            Some(pool) => match pool.get(s) {
                Some(found) => Str(found.clone()),
                None => {
                    let new: Rc<str> = Rc::from(s);
                    pool.insert(new.clone());
                    Str(new)
                }
            },
            None => Str(Rc::from(s)),
        })
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for Str {
    /// The empty string, one shared block for all.
    fn default() -> Str {
        Str(EMPTY.with(Rc::clone))
    }
}

impl Deref for Str {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Str {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for Str {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Str {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Str {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl From<&str> for Str {
    fn from(s: &str) -> Str {
        Str::intern(s)
    }
}

impl From<String> for Str {
    fn from(s: String) -> Str {
        Str::intern(&s)
    }
}

impl From<&String> for Str {
    fn from(s: &String) -> Str {
        Str::intern(s)
    }
}

impl PartialEq<str> for Str {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for Str {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for Str {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<Str> for str {
    fn eq(&self, other: &Str) -> bool {
        self == &*other.0
    }
}

impl PartialEq<Str> for &str {
    fn eq(&self, other: &Str) -> bool {
        *self == &*other.0
    }
}

impl serde::Serialize for Str {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Str {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Str, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Str;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Str, E> {
                Ok(Str::intern(s))
            }
        }
        d.deserialize_str(V)
    }
}
