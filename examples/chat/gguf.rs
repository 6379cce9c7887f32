//! A GGUF reader (versions 2 and 3): metadata, tensor directory and each tensor's raw bytes,
//! every malformed input a typed [`ChatError`], never a panic. The forward uploads the tensors'
//! blocks as they are stored (repacked to word-aligned arrays, `weights.rs`).

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::error::{ChatError, Result};

/// ggml type ids of the tensors the kernels read.
pub const F32: u32 = 0;
/// `f16`.
pub const F16: u32 = 1;
/// 32 weights: f16 scale `d`, f16 minimum `m`, 16 bytes of 4-bit codes; `w = d·q + m`.
pub const Q4_1: u32 = 3;
/// 32 weights: f16 scale `d`, 32 signed bytes; `w = d·q`.
pub const Q8_0: u32 = 8;

/// Bytes of one stored block of 32 values (one value for the float types) of ggml type `ty`,
/// and the values it holds; None for types this reader does not size.
pub fn block_bytes(ty: u32) -> Option<(u64, u64)> {
    match ty {
        F32 => Some((4, 1)),
        F16 => Some((2, 1)),
        2 => Some((18, 32)), // Q4_0
        Q4_1 => Some((20, 32)),
        Q8_0 => Some((34, 32)),
        _ => None,
    }
}

/// A metadata value.
#[derive(Clone, Debug)]
pub enum Value {
    /// Any integer type (u8 … i64), widened.
    Int(i64),
    /// `f32` or `f64`.
    Float(f64),
    /// `bool`.
    Bool(bool),
    /// UTF-8 text.
    Str(String),
    /// An array of values.
    Array(Vec<Value>),
}

/// One tensor's directory entry.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    /// Dimensions, GGUF order: `dims[0]` is the contiguous one (a matrix's columns).
    pub dims: Vec<u64>,
    /// ggml type id.
    pub ty: u32,
    /// Byte offset from the start of the data section.
    pub offset: u64,
}

/// An open GGUF file: its metadata and tensor directory; tensors are read on demand.
pub struct Gguf {
    /// The file's path (for errors).
    pub path: PathBuf,
    /// Metadata by key.
    pub metadata: HashMap<String, Value>,
    /// Tensors by name.
    pub tensors: HashMap<String, TensorInfo>,
    data_start: u64,
    file_len: u64,
    file: BufReader<File>,
}

/// Most elements an array or string may claim (a corrupt count must not allocate gigabytes).
const MAX_COUNT: u64 = 1 << 28;

struct Header<'a> {
    r: &'a mut BufReader<File>,
    path: &'a Path,
    len: u64,
}

impl Header<'_> {
    fn bad(&self, detail: impl Into<String>) -> ChatError {
        ChatError::BadGguf {
            path: self.path.to_path_buf(),
            detail: detail.into(),
        }
    }
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        self.r
            .read_exact(&mut b)
            .map_err(|e| self.bad(format!("truncated header ({e})")))?;
        Ok(b)
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }
    fn count(&mut self, what: &str) -> Result<u64> {
        let n = self.u64()?;
        if n > MAX_COUNT || n > self.len {
            return Err(self.bad(format!("{what} count {n} is past the file")));
        }
        Ok(n)
    }
    fn string(&mut self) -> Result<String> {
        let n = self.count("string length")?;
        let mut b = vec![0u8; n as usize];
        self.r
            .read_exact(&mut b)
            .map_err(|e| self.bad(format!("truncated string ({e})")))?;
        String::from_utf8(b).map_err(|_| self.bad("a string is not UTF-8"))
    }
    fn value(&mut self, ty: u32, depth: u32) -> Result<Value> {
        Ok(match ty {
            0 => Value::Int(self.bytes::<1>()?[0] as i64),
            1 => Value::Int(self.bytes::<1>()?[0] as i8 as i64),
            2 => Value::Int(u16::from_le_bytes(self.bytes()?) as i64),
            3 => Value::Int(i16::from_le_bytes(self.bytes()?) as i64),
            4 => Value::Int(self.u32()? as i64),
            5 => Value::Int(i32::from_le_bytes(self.bytes()?) as i64),
            6 => Value::Float(f32::from_le_bytes(self.bytes()?) as f64),
            7 => Value::Bool(self.bytes::<1>()?[0] != 0),
            8 => Value::Str(self.string()?),
            9 if depth < 4 => {
                let ty = self.u32()?;
                let n = self.count("array")?;
                let mut v = Vec::with_capacity(n.min(1 << 20) as usize);
                for _ in 0..n {
                    v.push(self.value(ty, depth + 1)?);
                }
                Value::Array(v)
            }
            10 => Value::Int(self.u64()? as i64),
            11 => Value::Int(i64::from_le_bytes(self.bytes()?)),
            12 => Value::Float(f64::from_le_bytes(self.bytes()?)),
            _ => return Err(self.bad(format!("metadata value type {ty}"))),
        })
    }
}

impl Gguf {
    /// Opens `path` and reads its header, metadata and tensor directory.
    pub fn open(path: &Path) -> Result<Gguf> {
        let io = |e| ChatError::Io {
            path: path.to_path_buf(),
            source: e,
        };
        let f = File::open(path).map_err(io)?;
        let len = f.metadata().map_err(io)?.len();
        let mut r = BufReader::with_capacity(1 << 20, f);
        let mut h = Header {
            r: &mut r,
            path,
            len,
        };
        if &h.bytes::<4>()? != b"GGUF" {
            return Err(h.bad("no GGUF magic"));
        }
        let version = h.u32()?;
        if !(2..=3).contains(&version) {
            return Err(h.bad(format!("version {version} (this reader takes 2 and 3)")));
        }
        let n_tensors = h.count("tensor")?;
        let n_kv = h.count("metadata")?;
        let mut metadata = HashMap::new();
        for _ in 0..n_kv {
            let key = h.string()?;
            let ty = h.u32()?;
            let v = h.value(ty, 0)?;
            metadata.insert(key, v);
        }
        let mut tensors = HashMap::new();
        for _ in 0..n_tensors {
            let name = h.string()?;
            let nd = h.u32()?;
            if nd == 0 || nd > 4 {
                return Err(h.bad(format!("tensor {name}: {nd} dimensions")));
            }
            let mut dims = Vec::with_capacity(nd as usize);
            for _ in 0..nd {
                dims.push(h.u64()?);
            }
            let ty = h.u32()?;
            let offset = h.u64()?;
            tensors.insert(name, TensorInfo { dims, ty, offset });
        }
        let align = match metadata.get("general.alignment") {
            Some(Value::Int(a)) if *a > 0 && (*a as u64).is_power_of_two() => *a as u64,
            Some(_) => return Err(h.bad("general.alignment is not a power of two")),
            None => 32,
        };
        let pos = h.r.stream_position().map_err(io)?;
        let data_start = pos.div_ceil(align) * align;
        Ok(Gguf {
            path: path.to_path_buf(),
            metadata,
            tensors,
            data_start,
            file_len: len,
            file: r,
        })
    }

    fn meta_err(&self, key: &str, problem: &str) -> ChatError {
        ChatError::Metadata {
            key: key.into(),
            problem: problem.into(),
        }
    }

    /// A metadata value, or a typed error naming the missing key.
    pub fn get(&self, key: &str) -> Result<&Value> {
        self.metadata
            .get(key)
            .ok_or_else(|| self.meta_err(key, "is missing"))
    }

    /// A positive integer metadata value.
    pub fn usize(&self, key: &str) -> Result<usize> {
        match self.get(key)? {
            Value::Int(v) if *v > 0 && *v < (1 << 32) => Ok(*v as usize),
            v => Err(self.meta_err(key, &format!("is {v:?}, not a positive integer"))),
        }
    }

    /// A float metadata value.
    pub fn float(&self, key: &str) -> Result<f64> {
        match self.get(key)? {
            Value::Float(v) => Ok(*v),
            Value::Int(v) => Ok(*v as f64),
            v => Err(self.meta_err(key, &format!("is {v:?}, not a number"))),
        }
    }

    /// A text metadata value.
    pub fn str(&self, key: &str) -> Result<&str> {
        match self.get(key)? {
            Value::Str(s) => Ok(s),
            v => Err(self.meta_err(key, &format!("is {v:?}, not text"))),
        }
    }

    /// An array metadata value.
    pub fn array(&self, key: &str) -> Result<&[Value]> {
        match self.get(key)? {
            Value::Array(a) => Ok(a),
            _ => Err(self.meta_err(key, "is not an array")),
        }
    }

    /// A tensor's directory entry, checked to have `dims` (GGUF order).
    pub fn info(&self, name: &str, dims: &[u64]) -> Result<&TensorInfo> {
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| ChatError::MissingTensor { name: name.into() })?;
        if t.dims != dims {
            return Err(ChatError::TensorShape {
                name: name.into(),
                expected: dims.to_vec(),
                found: t.dims.clone(),
            });
        }
        Ok(t)
    }

    /// A tensor's raw bytes, checked to have `dims`, a type the kernels read and to lie
    /// inside the file.
    pub fn read(&mut self, name: &str, dims: &[u64]) -> Result<(u32, Vec<u8>)> {
        let t = self.info(name, dims)?.clone();
        let type_err = || ChatError::TensorType {
            name: name.into(),
            ty: t.ty,
        };
        let (bytes, per) = block_bytes(t.ty).ok_or_else(type_err)?;
        if ![F32, F16, Q4_1, Q8_0].contains(&t.ty) {
            return Err(type_err());
        }
        let values: u64 = dims.iter().product();
        if !dims[0].is_multiple_of(per) {
            return Err(ChatError::Shape(format!(
                "tensor {name}: rows of {} values are no whole number of {per}-value blocks",
                dims[0]
            )));
        }
        let len = values / per * bytes;
        let start = self.data_start + t.offset;
        if start.checked_add(len).is_none_or(|end| end > self.file_len) {
            return Err(ChatError::BadGguf {
                path: self.path.clone(),
                detail: format!("tensor {name} runs past the end of the file"),
            });
        }
        let io = |e| ChatError::Io {
            path: self.path.clone(),
            source: e,
        };
        self.file.seek(SeekFrom::Start(start)).map_err(io)?;
        let mut buf = vec![0u8; len as usize];
        self.file.read_exact(&mut buf).map_err(io)?;
        Ok((t.ty, buf))
    }
}
