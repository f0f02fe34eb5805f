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
    static LISTS: RefCell<Option<HashSet<Rc<[Str]>>>> = const { RefCell::new(None) };
    static EMPTY: Rc<str> = Rc::from("");
}

/// Runs `f` (a parse) with a fresh pool: every [`Str`] deserialized meanwhile is shared with any
/// equal one deserialized before it in the same run. Nests (the inner run has its own pool).
pub fn interning<T>(f: impl FnOnce() -> T) -> T {
    let outer = POOL.with(|p| p.borrow_mut().replace(HashSet::new()));
    let outer_lists = LISTS.with(|p| p.borrow_mut().replace(HashSet::new()));
    let out = f();
    POOL.with(|p| *p.borrow_mut() = outer);
    LISTS.with(|p| *p.borrow_mut() = outer_lists);
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

/// An immutable list of [`Str`]s (a resource's verbs, short names, categories), interned like
/// them: 20 000 CRD resources have a handful of distinct verb lists, and as a `Vec` each cost a
/// heap block of its own, most of what a parsed resource holds after the strings were shared.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Strs(Rc<[Str]>);

impl Strs {
    /// `list`, shared with an equal list from the pool of a running [`interning`] (if any).
    pub fn intern(list: Vec<Str>) -> Strs {
        if list.is_empty() {
            return Strs::default();
        }
        LISTS.with(|p| match p.borrow_mut().as_mut() {
            Some(pool) => match pool.get(list.as_slice()) {
                Some(found) => Strs(found.clone()),
                None => {
                    let new: Rc<[Str]> = Rc::from(list);
                    pool.insert(new.clone());
                    Strs(new)
                }
            },
            None => Strs(Rc::from(list)),
        })
    }

    /// For serde's `skip_serializing_if`.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Deref for Strs {
    type Target = [Str];
    fn deref(&self) -> &[Str] {
        &self.0
    }
}

impl From<Vec<Str>> for Strs {
    fn from(v: Vec<Str>) -> Strs {
        Strs::intern(v)
    }
}

impl FromIterator<Str> for Strs {
    fn from_iter<I: IntoIterator<Item = Str>>(i: I) -> Strs {
        Strs::intern(i.into_iter().collect())
    }
}

impl<'a> IntoIterator for &'a Strs {
    type Item = &'a Str;
    type IntoIter = std::slice::Iter<'a, Str>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl PartialEq<Vec<&str>> for Strs {
    fn eq(&self, other: &Vec<&str>) -> bool {
        self.0.len() == other.len() && self.0.iter().zip(other).all(|(a, b)| a == b)
    }
}

impl fmt::Debug for Strs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.iter()).finish()
    }
}

impl serde::Serialize for Strs {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for Strs {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Strs, D::Error> {
        Vec::<Str>::deserialize(d).map(Strs::intern)
    }
}
