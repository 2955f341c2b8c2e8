//! Fortran-ordered arrays: numpy and ONNX Runtime accept them, so layerwise
//! reads them, in C order. The files are written by hand here, byte by byte as numpy's format
//! describes, with the values numpy would store for `np.asfortranarray`.

use std::path::Path;

use layerwise_runtime::npy::read_npy;

/// An `.npy` (version 1.0) of float32 `values` as stored, with this header.
fn npy(fortran: bool, shape: &str, stored: &[f32]) -> Vec<u8> {
    let mut header =
        format!("{{'descr': '<f4', 'fortran_order': {}, 'shape': {shape}, }}", if fortran { "True" } else { "False" });
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend((header.len() as u16).to_le_bytes());
    bytes.extend(header.as_bytes());
    bytes.extend(stored.iter().flat_map(|v| v.to_le_bytes()));
    bytes
}

#[test]
fn a_fortran_ordered_array_is_read_in_c_order() {
    // [[0, 1, 2], [3, 4, 5]] in Fortran order is stored column by column: 0 3 1 4 2 5.
    let t = read_npy(&npy(true, "(2, 3)", &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0])[..], Path::new("f.npy")).unwrap();
    assert_eq!(t.shape, vec![2, 3]);
    assert_eq!(t.to_f32().to_vec(), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);

    // Three dimensions: element [i][j][k] = 100 i + 10 j + k, shape (2, 2, 3); Fortran storage
    // runs i fastest, then j, then k.
    let mut stored = Vec::new();
    for k in 0..3 {
        for j in 0..2 {
            for i in 0..2 {
                stored.push((100 * i + 10 * j + k) as f32);
            }
        }
    }
    let t = read_npy(&npy(true, "(2, 2, 3)", &stored)[..], Path::new("f3.npy")).unwrap();
    let c_order: Vec<f32> =
        (0..2).flat_map(|i| (0..2).flat_map(move |j| (0..3).map(move |k| (100 * i + 10 * j + k) as f32))).collect();
    assert_eq!(t.to_f32().to_vec(), c_order);

    // A C-ordered array and a vector are as stored.
    let c = read_npy(&npy(false, "(2, 3)", &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0])[..], Path::new("c.npy")).unwrap();
    assert_eq!(c.to_f32().to_vec(), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    let v = read_npy(&npy(true, "(4,)", &[1.0, 2.0, 3.0, 4.0])[..], Path::new("v.npy")).unwrap();
    assert_eq!(v.to_f32().to_vec(), vec![1.0, 2.0, 3.0, 4.0]);
}
