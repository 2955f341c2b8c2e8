//! A LayerNorm written out as elementary ops, the way exporters before opset 17 wrote it:
//! `ReduceMean -> Sub -> Pow (or Mul by itself) -> ReduceMean -> Add eps -> Sqrt -> Div`, then
//! `Mul gamma -> Add beta` where present. Analysis keeps it together in FP32; `convert` must write
//! it so that ONNX Runtime's LayerNormFusion cannot turn it into an ill-typed node.

use crate::GraphIndex;

/// The nodes of one decomposed LayerNorm, as topological indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecomposedLayerNorm {
    pub mean: usize,
    pub sub: usize,
    pub square: usize,
    pub variance: usize,
    pub add_epsilon: usize,
    pub sqrt: usize,
    pub div: usize,
    /// `Mul` by gamma, where the Div's only reader is one.
    pub scale: Option<usize>,
    /// `Add` of beta, where the scale's only reader is one.
    pub shift: Option<usize>,
}

impl DecomposedLayerNorm {
    /// The pattern anchored at the `Sub` node `sub` (`x - mean(x)`), or None.
    pub fn at(index: &GraphIndex, sub: usize) -> Option<DecomposedLayerNorm> {
        let s = &index.nodes[sub];
        if s.op_type != "Sub" {
            return None;
        }
        let (x, m) = (s.inputs.first()?, s.inputs.get(1)?);
        let mean = index.producer_index(m)?;
        if index.nodes[mean].op_type != "ReduceMean" || index.nodes[mean].inputs.first() != Some(x) {
            return None;
        }
        let square = index.node_consumers(sub).into_iter().find(|&c| {
            let n = &index.nodes[c];
            n.op_type == "Pow" || (n.op_type == "Mul" && n.inputs.first() == n.inputs.get(1))
        })?;
        let variance = index.consumer_of_type(square, "ReduceMean")?;
        let add_epsilon = index.consumer_of_type(variance, "Add")?;
        let sqrt = index.consumer_of_type(add_epsilon, "Sqrt")?;
        let div = index.consumer_of_type(sqrt, "Div")?;
        if !index.nodes[div].inputs.contains(&s.outputs[0]) {
            return None;
        }
        let scale = index.sole_consumer_of_type(div, "Mul");
        let shift = scale.and_then(|m| index.sole_consumer_of_type(m, "Add"));
        Some(DecomposedLayerNorm { mean, sub, square, variance, add_epsilon, sqrt, div, scale, shift })
    }

    /// Every node, in the order the pattern computes them.
    pub fn nodes(&self) -> Vec<usize> {
        let body = [self.mean, self.sub, self.square, self.variance, self.add_epsilon, self.sqrt, self.div];
        body.into_iter().chain(self.scale).chain(self.shift).collect()
    }
}
