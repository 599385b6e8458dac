//! A user's term measured and digested at a cost bounded by its size in
//! memory (see `EXLA.SharedTerm`).
//!
//! A term may share subterms: `Enum.reduce(1..40, :a, &{&2, &2})` is 40
//! tuples in memory and 2^40 leaves as a tree. Everything the VM does to a
//! term as a whole (hash it, compare it, copy it into ETS, a persistent
//! term or a message) walks the tree, in one call that does not yield.
//! Here, `term_tree_size` walks the tree too, but stops once it has seen
//! `budget` words; `term_digest` walks each subterm in memory once, keyed
//! by its address, which is stable for the length of a NIF call.
//!
//! Functions are opaque to NIFs (no NIF API reads a closure's captured
//! values): both report them, and Elixir expands them
//! (`:erlang.fun_info/2`) and asks again.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::mem::MaybeUninit;

use rustler::sys::{self, ErlNifMapIteratorEntry, ERL_NIF_TERM};
use rustler::types::binary::Binary;
use rustler::{Encoder, Env, NewBinary, Term, TermType};
use xxhash_rust::xxh3::xxh3_128_with_seed;

mod atoms {
    rustler::atoms! { ok, over, funs, __struct__, tensor = "Elixir.Nx.Tensor", r#type = "type", shape }
}

/// Words a term counts as in a tree walk, beyond its children: about what
/// hashing or copying it reads.
const FUN_WORDS: u64 = 8;
const BOXED_LEAF_WORDS: u64 = 4;

/// The elements of a tuple, in the term's own memory (no copy).
fn tuple_elements<'a>(term: Term<'a>) -> Option<impl DoubleEndedIterator<Item = Term<'a>>> {
    let env = term.get_env();
    // SAFETY: `term` is a valid term of `env`; the slice points into the
    // tuple, which lives as long as `env` ('a).
    let elements = unsafe { rustler::wrapper::tuple::get_tuple(env.as_c_arg(), term.as_c_arg()) };
    let elements: &'a [ERL_NIF_TERM] = elements.ok()?;
    // SAFETY: each element is a valid term of `env`.
    Some(elements.iter().map(move |&t| unsafe { Term::new(env, t) }))
}

/// The key-value pairs of a map, read with the VM's iterator (rustler's
/// compares keys as it goes, which walks shared keys as trees).
fn map_pairs<'a>(map: Term<'a>) -> Vec<(Term<'a>, Term<'a>)> {
    let env = map.get_env();
    let raw_env = env.as_c_arg();
    let mut pairs = Vec::new();
    let mut iter = MaybeUninit::<sys::ErlNifMapIterator>::uninit();
    // SAFETY: `map` is a map of `env`; the iterator is created, used and
    // destroyed here, and the keys and values it gives are terms of `env`.
    unsafe {
        let entry = ErlNifMapIteratorEntry::ERL_NIF_MAP_ITERATOR_HEAD;
        if sys::enif_map_iterator_create(raw_env, map.as_c_arg(), iter.as_mut_ptr(), entry) == 0 {
            return pairs;
        }
        let (mut key, mut value) = (0, 0);
        while sys::enif_map_iterator_get_pair(raw_env, iter.as_mut_ptr(), &mut key, &mut value) != 0
        {
            pairs.push((Term::new(env, key), Term::new(env, value)));
            sys::enif_map_iterator_next(raw_env, iter.as_mut_ptr());
        }
        sys::enif_map_iterator_destroy(raw_env, iter.as_mut_ptr());
    }
    pairs
}

/// The bytes of a binary (whole bytes only; a bitstring is `None`).
fn binary_bytes<'a>(term: Term<'a>) -> Option<&'a [u8]> {
    Binary::from_term(term).ok().map(|b| b.as_slice())
}

/// The raw calls of `term_tree_size`'s walk, which meets every node of a
/// key on every call of a jitted function: rustler's wrappers (a `Result`
/// and an error value per list end, a conversion per type) took most of
/// its time.
mod raw {
    use rustler::sys::{self, ErlNifTermType, ERL_NIF_TERM};
    use rustler::Env;

    pub fn kind(env: Env, term: ERL_NIF_TERM) -> ErlNifTermType {
        // SAFETY: `term` is a term of `env`, which is alive for the call.
        unsafe { sys::enif_term_type(env.as_c_arg(), term) }
    }

    pub fn cell(env: Env, term: ERL_NIF_TERM) -> Option<(ERL_NIF_TERM, ERL_NIF_TERM)> {
        let (mut head, mut tail) = (0, 0);
        // SAFETY: as above; the VM writes both only when it returns true.
        let is_cell =
            unsafe { sys::enif_get_list_cell(env.as_c_arg(), term, &mut head, &mut tail) } != 0;
        is_cell.then_some((head, tail))
    }

    pub fn is_nil(env: Env, term: ERL_NIF_TERM) -> bool {
        // SAFETY: as above.
        unsafe { sys::enif_is_empty_list(env.as_c_arg(), term) != 0 }
    }

    pub fn is_small_integer(env: Env, term: ERL_NIF_TERM) -> bool {
        let mut value = 0;
        // SAFETY: as above.
        unsafe { sys::enif_get_int64(env.as_c_arg(), term, &mut value) != 0 }
    }
}

/// Pushes an element of a list, tuple or map to be walked, unless it is
/// an atom or a small integer, which its slot holds whole (popping and
/// looking at those again was most of the walk of a list of numbers).
fn push_unless_immediate(env: Env, term: ERL_NIF_TERM, pending: &mut Vec<ERL_NIF_TERM>) {
    use rustler::sys::ErlNifTermType::*;
    match raw::kind(env, term) {
        ERL_NIF_TERM_TYPE_ATOM => {}
        ERL_NIF_TERM_TYPE_INTEGER if raw::is_small_integer(env, term) => {}
        _ => pending.push(term),
    }
}

/// Walks `term` as a tree, up to `budget` words. Returns `{:ok, left,
/// funs}` (the budget left and every function met, once per occurrence:
/// their captured values are not counted yet) or `:over`. The functions
/// in `skip` (the same terms in memory) count as leaves and are not
/// listed. On a normal scheduler: the budget bounds the walk.
#[rustler::nif]
fn term_tree_size<'a>(env: Env<'a>, term: Term<'a>, budget: u64, skip: Vec<Term<'a>>) -> Term<'a> {
    use rustler::sys::ErlNifTermType::*;
    let mut left = budget;
    let mut funs = Vec::new();
    let mut pending = Vec::with_capacity(64);
    pending.push(term.as_c_arg());
    while let Some(raw_term) = pending.pop() {
        // SAFETY: every term pushed is `term` or a part of it.
        let node = unsafe { Term::new(env, raw_term) };
        let words = match raw::kind(env, raw_term) {
            ERL_NIF_TERM_TYPE_LIST => {
                // The cells are followed here (a list may be long), the
                // elements pushed but for atoms and small integers, and an
                // improper tail pushed.
                let (mut cell, mut words) = (raw_term, 0);
                while let Some((head, tail)) = raw::cell(env, cell) {
                    push_unless_immediate(env, head, &mut pending);
                    words += 2;
                    if words > left {
                        return atoms::over().encode(env);
                    }
                    cell = tail;
                }
                if !raw::is_nil(env, cell) {
                    pending.push(cell);
                }
                words
            }
            ERL_NIF_TERM_TYPE_TUPLE => {
                let elements = tuple_elements(node).into_iter().flatten();
                elements.fold(1, |words, element| {
                    push_unless_immediate(env, element.as_c_arg(), &mut pending);
                    words + 1
                })
            }
            ERL_NIF_TERM_TYPE_MAP => map_pairs(node).into_iter().fold(2, |words, (k, v)| {
                push_unless_immediate(env, k.as_c_arg(), &mut pending);
                push_unless_immediate(env, v.as_c_arg(), &mut pending);
                words + 2
            }),
            ERL_NIF_TERM_TYPE_FUN => {
                if !skip.iter().any(|s| s.as_c_arg() == raw_term) {
                    funs.push(node);
                }
                FUN_WORDS
            }
            ERL_NIF_TERM_TYPE_BITSTRING => match binary_bytes(node) {
                Some(bytes) => 2 + bytes.len().div_ceil(8) as u64,
                None => 2 + node.to_binary().len().div_ceil(8) as u64,
            },
            ERL_NIF_TERM_TYPE_INTEGER if !raw::is_small_integer(env, raw_term) => {
                2 + node.to_binary().len().div_ceil(8) as u64
            }
            ERL_NIF_TERM_TYPE_ATOM | ERL_NIF_TERM_TYPE_INTEGER => 1,
            _ => BOXED_LEAF_WORDS,
        };
        if words > left {
            return atoms::over().encode(env);
        }
        left -= words;
    }
    (atoms::ok(), left, funs).encode(env)
}

/// Addresses hash to themselves, mixed: the memo of `term_digest` is
/// keyed by terms' addresses (SipHash, the default, cost a third of the
/// walk).
#[derive(Default)]
struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3);
        }
    }

    fn write_usize(&mut self, word: usize) {
        self.0 = (word as u64 ^ (word as u64 >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

type Memo = HashMap<ERL_NIF_TERM, u128, BuildHasherDefault<AddressHasher>>;

// What each kind of node hashes as (xxh3's seed): a node's digest is the
// XXH3-128 of its children's digests, a leaf's that of its bytes.
const ATOM: u64 = 1;
const INTEGER: u64 = 2;
const FLOAT: u64 = 3;
const BINARY: u64 = 4;
const TUPLE: u64 = 5;
const CONS: u64 = 6;
const NIL: u64 = 7;
const MAP: u64 = 8;
const PAIR: u64 = 9;
const EXTERNAL: u64 = 10;
const TENSOR: u64 = 11;

fn digest_of(seed: u64, bytes: &[u8]) -> u128 {
    xxh3_128_with_seed(bytes, seed)
}

/// The digest of a node of `seed` whose children have `digests`.
fn node_digest(seed: u64, digests: &[u128], scratch: &mut Vec<u8>) -> u128 {
    scratch.clear();
    for digest in digests {
        scratch.extend_from_slice(&digest.to_le_bytes());
    }
    digest_of(seed, scratch)
}

/// The post-order walk of `term_digest`: a node's digest is pushed on
/// `values` once its children's are.
enum Step<'a> {
    Enter(Term<'a>),
    /// A tuple, a list cell or a tensor by shape: the digest of its seed
    /// over its last `usize` children's.
    Node(Term<'a>, u64, usize),
    Run(Vec<(Term<'a>, u128)>),
    Map(Term<'a>, usize),
}

/// One list cell in this many is remembered within a run of cells whose
/// elements are numbers or atoms: a tail shared by two lists is walked
/// again only up to its next remembered cell, and a list of a million
/// numbers costs a sixteenth of the memo's inserts.
const RUN_SAMPLE: usize = 16;

struct Digester<'a> {
    memo: Memo,
    known: Memo,
    unknown: Vec<Term<'a>>,
    by_shape: bool,
    scratch: Vec<u8>,
}

impl<'a> Digester<'a> {
    fn digest(&mut self, term: Term<'a>) -> u128 {
        let mut steps = vec![Step::Enter(term)];
        let mut values: Vec<u128> = Vec::new();
        while let Some(step) = steps.pop() {
            match step {
                Step::Enter(term) => match self.memo.get(&term.as_c_arg()) {
                    Some(&value) => values.push(value),
                    None => self.enter(term, &mut steps, &mut values),
                },
                Step::Node(term, seed, children) => {
                    let start = values.len() - children;
                    let digest = node_digest(seed, &values[start..], &mut self.scratch);
                    values.truncate(start);
                    self.remember(term, digest, &mut values);
                }
                Step::Run(cells) => {
                    let mut digest = values.pop().unwrap_or_default();
                    for (i, (cell, head)) in cells.into_iter().enumerate().rev() {
                        digest = node_digest(CONS, &[head, digest], &mut self.scratch);
                        let address = cell.as_c_arg();
                        if i == 0 || (address >> 4) % RUN_SAMPLE == 0 {
                            self.memo.insert(cell.as_c_arg(), digest);
                        }
                    }
                    values.push(digest);
                }
                Step::Map(term, size) => {
                    // Equal maps may iterate in different orders: the
                    // digests of their pairs are summed.
                    let start = values.len() - 2 * size;
                    let sum = values[start..].chunks(2).fold(0u128, |sum, pair| {
                        sum.wrapping_add(node_digest(PAIR, pair, &mut self.scratch))
                    });
                    values.truncate(start);
                    let digest = node_digest(MAP, &[size as u128, sum], &mut self.scratch);
                    self.remember(term, digest, &mut values);
                }
            }
        }
        values.pop().unwrap_or_default()
    }

    fn remember(&mut self, term: Term<'a>, digest: u128, values: &mut Vec<u128>) {
        self.memo.insert(term.as_c_arg(), digest);
        values.push(digest);
    }

    fn enter(&mut self, term: Term<'a>, steps: &mut Vec<Step<'a>>, values: &mut Vec<u128>) {
        let leaf = match term.get_type() {
            TermType::Tuple => {
                let start = steps.len();
                steps.push(Step::Node(term, TUPLE, 0));
                steps.extend(tuple_elements(term).into_iter().flatten().map(Step::Enter));
                let arity = steps.len() - start - 1;
                steps[start] = Step::Node(term, TUPLE, arity);
                steps[start + 1..].reverse();
                return;
            }
            TermType::List => match term.list_get_cell() {
                Ok((head, tail)) => {
                    if let Some(head) = self.scalar_digest(head) {
                        self.enter_run(term, head, tail, steps);
                    } else {
                        steps.push(Step::Node(term, CONS, 2));
                        steps.push(Step::Enter(tail));
                        steps.push(Step::Enter(head));
                    }
                    return;
                }
                Err(_) => digest_of(NIL, &[]),
            },
            TermType::Map => {
                if let Some((kind, shape)) = self.tensor_fields(term) {
                    steps.push(Step::Node(term, TENSOR, 2));
                    steps.push(Step::Enter(shape));
                    steps.push(Step::Enter(kind));
                    return;
                }
                let pairs = map_pairs(term);
                steps.push(Step::Map(term, pairs.len()));
                for (key, value) in pairs.into_iter().rev() {
                    steps.push(Step::Enter(value));
                    steps.push(Step::Enter(key));
                }
                return;
            }
            TermType::Fun => {
                let value = match self.known.get(&term.as_c_arg()) {
                    Some(&digest) => digest,
                    None => {
                        self.unknown.push(term);
                        // Met again, it is not listed twice.
                        self.known.insert(term.as_c_arg(), 0);
                        0
                    }
                };
                values.push(value);
                return;
            }
            TermType::Integer => match term.decode::<i64>() {
                // Small integers are not remembered: they cost less than
                // the memo.
                Ok(integer) => {
                    values.push(digest_of(INTEGER, &integer.to_le_bytes()));
                    return;
                }
                Err(_) => digest_of(EXTERNAL, &term.to_binary()),
            },
            TermType::Atom => digest_of(ATOM, &term.to_binary()),
            TermType::Float => match term.decode::<f64>() {
                Ok(float) => digest_of(FLOAT, &float.to_bits().to_le_bytes()),
                Err(_) => digest_of(EXTERNAL, &term.to_binary()),
            },
            TermType::Binary => match binary_bytes(term) {
                Some(bytes) => digest_of(BINARY, bytes),
                None => digest_of(EXTERNAL, &term.to_binary()),
            },
            // Pids, ports, references: their external form is exact.
            _ => digest_of(EXTERNAL, &term.to_binary()),
        };
        self.remember(term, leaf, values);
    }

    /// The digest of a small integer, a float or an atom (those a list of
    /// numbers or atoms holds); `None` for other terms.
    fn scalar_digest(&mut self, term: Term<'a>) -> Option<u128> {
        match term.get_type() {
            TermType::Integer => term
                .decode::<i64>()
                .ok()
                .map(|integer| digest_of(INTEGER, &integer.to_le_bytes())),
            TermType::Float => term
                .decode::<f64>()
                .ok()
                .map(|float| digest_of(FLOAT, &float.to_bits().to_le_bytes())),
            TermType::Atom => Some(match self.memo.get(&term.as_c_arg()) {
                Some(&digest) => digest,
                None => {
                    let digest = digest_of(ATOM, &term.to_binary());
                    self.memo.insert(term.as_c_arg(), digest);
                    digest
                }
            }),
            _ => None,
        }
    }

    /// Follows the cells of a list from `cell` (whose head's digest is
    /// `head`) while their heads are scalars, up to a remembered cell; the
    /// run's digests are computed from the digest of what follows it.
    fn enter_run(&mut self, cell: Term<'a>, head: u128, tail: Term<'a>, steps: &mut Vec<Step<'a>>) {
        let mut cells = vec![(cell, head)];
        let mut rest = tail;
        while !self.memo.contains_key(&rest.as_c_arg()) {
            let Ok((head, tail)) = rest.list_get_cell() else {
                break;
            };
            let Some(head) = self.scalar_digest(head) else {
                break;
            };
            cells.push((rest, head));
            rest = tail;
        }
        steps.push(Step::Run(cells));
        steps.push(Step::Enter(rest));
    }

    /// With `by_shape`, an `Nx.Tensor` stands for its type and shape.
    fn tensor_fields(&self, map: Term<'a>) -> Option<(Term<'a>, Term<'a>)> {
        if !self.by_shape {
            return None;
        }
        let module = map.map_get(atoms::__struct__()).ok()?;
        if module.decode::<rustler::Atom>().ok()? != atoms::tensor() {
            return None;
        }
        Some((
            map.map_get(atoms::r#type()).ok()?,
            map.map_get(atoms::shape()).ok()?,
        ))
    }
}

/// The digest of `term` (16 bytes): `{:ok, digest}`, or `{:funs, funs}`
/// when it holds functions that `known` (a list of `{function, digest}`)
/// does not give, each listed once. Subterms are digested once each,
/// wherever they are shared; equal terms get equal digests however they
/// share. With `by_shape`, tensors count by type and shape only. On a
/// dirty CPU scheduler: the time is the term's size in memory.
#[rustler::nif(schedule = "DirtyCpu")]
fn term_digest<'a>(
    env: Env<'a>,
    term: Term<'a>,
    known: Vec<(Term<'a>, Binary<'a>)>,
    by_shape: bool,
) -> Term<'a> {
    let known = known
        .iter()
        .map(|(fun, digest)| {
            let mut word = [0u8; 16];
            let n = digest.len().min(16);
            word[..n].copy_from_slice(&digest.as_slice()[..n]);
            (fun.as_c_arg(), u128::from_be_bytes(word))
        })
        .collect();
    let mut digester = Digester {
        memo: Memo::default(),
        known,
        unknown: Vec::new(),
        by_shape,
        scratch: Vec::new(),
    };
    let digest = digester.digest(term);
    if !digester.unknown.is_empty() {
        return (atoms::funs(), digester.unknown).encode(env);
    }
    let mut binary = NewBinary::new(env, 16);
    binary.as_mut_slice().copy_from_slice(&digest.to_be_bytes());
    (atoms::ok(), Binary::from(binary)).encode(env)
}
