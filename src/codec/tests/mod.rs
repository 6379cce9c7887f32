//! Unit tests of the codec names, layouts, codebooks, rotations and reference codec.

mod encode;
mod math;
mod names;
mod quality;

use super::lloyd::{codebook, erf, erfc};
use super::rotation::*;
use super::*;
use crate::error::KvqError;

const DIMS: [u32; 4] = [64, 96, 128, 256];

fn all_codecs() -> Vec<Codec> {
    Codec::valid_names()
        .iter()
        .map(|n| Codec::parse(n).unwrap())
        .collect()
}

fn unit_gaussian(g: &mut GaussianStream, d: usize) -> Vec<f64> {
    loop {
        let v: Vec<f64> = (0..d).map(|_| g.next_gaussian()).collect();
        let n = norm(&v);
        if n > 0.0 {
            return v.iter().map(|x| x / n).collect();
        }
    }
}

fn norm(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn to_f32(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}
