//! Building small ONNX models in code: the demo model and the test models.

use bytes::Bytes;

use crate::onnx::{
    attribute_proto::AttributeType, tensor_proto::DataType, tensor_shape_proto, type_proto, AttributeProto, GraphProto,
    ModelProto, NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};

/// Builds a single-graph model, one call per input, initializer, node and output.
#[derive(Debug, Clone)]
pub struct ModelBuilder {
    graph: GraphProto,
    opset: i64,
}

/// One dimension of a declared input shape.
#[derive(Debug, Clone)]
pub enum Dim {
    Fixed(i64),
    Symbolic(String),
}

impl From<i64> for Dim {
    fn from(v: i64) -> Dim {
        Dim::Fixed(v)
    }
}

impl From<&str> for Dim {
    fn from(v: &str) -> Dim {
        Dim::Symbolic(v.to_string())
    }
}

/// A tensor value type, for [`ModelBuilder::input`] and [`ModelBuilder::output`].
pub fn tensor_type(elem: DataType, dims: Option<&[Dim]>) -> TypeProto {
    let shape = dims.map(|dims| TensorShapeProto {
        dim: dims
            .iter()
            .map(|d| tensor_shape_proto::Dimension {
                value: Some(match d {
                    Dim::Fixed(v) => tensor_shape_proto::dimension::Value::DimValue(*v),
                    Dim::Symbolic(s) => tensor_shape_proto::dimension::Value::DimParam(s.clone()),
                }),
                ..Default::default()
            })
            .collect(),
    });
    TypeProto {
        value: Some(type_proto::Value::TensorType(type_proto::Tensor { elem_type: Some(elem as i32), shape })),
        ..Default::default()
    }
}

/// A node for a graph or a subgraph body; `name` may be empty (layerwise then names it `OpType#i`).
pub fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str], attrs: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        op_type: Some(op.into()),
        name: if name.is_empty() { None } else { Some(name.into()) },
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        attribute: attrs,
        ..Default::default()
    }
}

/// A float32 tensor with inline raw data.
pub fn f32_tensor(name: &str, dims: &[i64], values: &[f32]) -> TensorProto {
    assert_eq!(dims.iter().product::<i64>() as usize, values.len(), "shape of '{name}' does not match its data");
    TensorProto {
        name: Some(name.to_string()),
        dims: dims.to_vec(),
        data_type: Some(DataType::Float as i32),
        raw_data: Some(Bytes::from(values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())),
        ..Default::default()
    }
}

/// An int64 tensor with inline raw data.
pub fn i64_tensor(name: &str, dims: &[i64], values: &[i64]) -> TensorProto {
    TensorProto {
        name: Some(name.to_string()),
        dims: dims.to_vec(),
        data_type: Some(DataType::Int64 as i32),
        raw_data: Some(Bytes::from(values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())),
        ..Default::default()
    }
}

/// Attribute constructors.
pub mod attr {
    use super::*;

    pub fn int(name: &str, v: i64) -> AttributeProto {
        AttributeProto {
            name: Some(name.into()),
            r#type: Some(AttributeType::Int as i32),
            i: Some(v),
            ..Default::default()
        }
    }
    pub fn float(name: &str, v: f32) -> AttributeProto {
        AttributeProto {
            name: Some(name.into()),
            r#type: Some(AttributeType::Float as i32),
            f: Some(v),
            ..Default::default()
        }
    }
    pub fn ints(name: &str, v: &[i64]) -> AttributeProto {
        AttributeProto {
            name: Some(name.into()),
            r#type: Some(AttributeType::Ints as i32),
            ints: v.to_vec(),
            ..Default::default()
        }
    }
    pub fn tensor(name: &str, t: TensorProto) -> AttributeProto {
        AttributeProto {
            name: Some(name.into()),
            r#type: Some(AttributeType::Tensor as i32),
            t: Some(t),
            ..Default::default()
        }
    }
    pub fn graph(name: &str, g: GraphProto) -> AttributeProto {
        AttributeProto {
            name: Some(name.into()),
            r#type: Some(AttributeType::Graph as i32),
            g: Some(g),
            ..Default::default()
        }
    }
}

impl ModelBuilder {
    pub fn new(name: &str, opset: i64) -> ModelBuilder {
        ModelBuilder { graph: GraphProto { name: Some(name.to_string()), ..Default::default() }, opset }
    }

    pub fn input(&mut self, name: &str, elem: DataType, dims: &[Dim]) -> &mut Self {
        self.graph.input.push(ValueInfoProto {
            name: Some(name.into()),
            r#type: Some(tensor_type(elem, Some(dims))),
            ..Default::default()
        });
        self
    }

    /// Declares a graph output with its element type and no shape.
    pub fn output(&mut self, name: &str, elem: DataType) -> &mut Self {
        self.graph.output.push(ValueInfoProto {
            name: Some(name.into()),
            r#type: Some(tensor_type(elem, None)),
            ..Default::default()
        });
        self
    }

    pub fn initializer(&mut self, t: TensorProto) -> &mut Self {
        self.graph.initializer.push(t);
        self
    }

    /// Adds a node; `name` may be empty (layerwise then names it `OpType#i`).
    pub fn node(
        &mut self,
        op: &str,
        name: &str,
        inputs: &[&str],
        outputs: &[&str],
        attrs: Vec<AttributeProto>,
    ) -> &mut Self {
        self.graph.node.push(node(op, name, inputs, outputs, attrs));
        self
    }

    pub fn graph(&self) -> &GraphProto {
        &self.graph
    }

    pub fn build(&self) -> ModelProto {
        ModelProto {
            ir_version: Some(8),
            producer_name: Some("layerwise".into()),
            opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(self.opset) }],
            graph: Some(self.graph.clone()),
            ..Default::default()
        }
    }
}
