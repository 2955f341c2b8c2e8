use layerwise_runtime::{BackendSpec, ExecutionProvider, OptLevel};

fn ep(spec: &str) -> ExecutionProvider {
    match BackendSpec::parse(spec).unwrap() {
        BackendSpec::Ort(o) => o.ep,
        other => panic!("{spec}: {other:?}"),
    }
}

fn err(spec: &str) -> String {
    BackendSpec::parse(spec).unwrap_err().to_string()
}

#[test]
fn gpu_specs_parse_with_their_options() {
    assert_eq!(ep("ort:cpu"), ExecutionProvider::Cpu);
    assert_eq!(
        ep("ort:cuda"),
        ExecutionProvider::Cuda { device: None, tf32: true, conv_search: layerwise_runtime::ConvSearch::Exhaustive },
        "TF32 on, as ONNX Runtime defaults"
    );
    assert_eq!(
        ep("ort:cuda,tf32=off,device=1"),
        ExecutionProvider::Cuda {
            device: Some(1),
            tf32: false,
            conv_search: layerwise_runtime::ConvSearch::Exhaustive
        }
    );
    assert_eq!(
        ep("ort:cuda,conv_search=heuristic"),
        ExecutionProvider::Cuda { device: None, tf32: true, conv_search: layerwise_runtime::ConvSearch::Heuristic }
    );
    assert!(err("ort:cuda,conv_search=fast").contains("exhaustive, heuristic or default"));
    assert!(err("ort:cpu,conv_search=heuristic").contains("is for ort:cuda"));
    assert!(matches!(
        BackendSpec::parse("sim:bf16,engine=trt").unwrap(),
        BackendSpec::Sim { rounding: layerwise_model::Rounding::Bf16, trt_style: true, .. }
    ));
    assert!(err("sim:tf32,engine=trt").contains("unknown option"));
    assert_eq!(ep("ort:trt,fp16"), ExecutionProvider::TensorRt { device: None, fp16: true });
    assert_eq!(ep("ort:nvrtx,device=2"), ExecutionProvider::NvRtx { device: Some(2) });
    match BackendSpec::parse("ort:cuda,opt=basic,threads=2").unwrap() {
        BackendSpec::Ort(o) => assert_eq!((o.opt_level, o.threads), (OptLevel::Basic, Some(2))),
        other => panic!("{other:?}"),
    }
    assert!(
        matches!(BackendSpec::parse("sim:fp16").unwrap(), BackendSpec::Sim { rounding: layerwise_model::Rounding::Fp16, trt_style: false, options: o } if o.opt_level == OptLevel::Disable)
    );
}

#[test]
fn bad_specs_say_what_is_wrong() {
    assert!(err("ort:cuda,tf32=maybe").contains("tf32 must be on or off"));
    assert!(err("ort:cpu,tf32=on").contains("option 'tf32' is for ort:cuda"));
    assert!(err("ort:cpu,fp16").contains("option 'fp16' is for ort:trt"));
    assert!(err("ort:cpu,device=1").contains("option 'device' is for GPU backends"));
    assert!(err("ort:cuda,device=gpu0").contains("device must be a GPU index"));
    assert!(err("sim:fp16,opt=all").contains("unknown option 'opt' for sim:fp16"));
    assert!(err("onnx:cpu").contains("'onnx:cpu' is not a backend"));
    assert!(err("npz:").contains("npz: needs a path"));
    assert!(err("trt,opt=9").contains("opt must be 0 to 5"));
    assert!(err("trt,fp16").contains("unknown option 'fp16' for trt"));
    assert_eq!(
        BackendSpec::parse("trt,opt=3,workspace=512").unwrap(),
        BackendSpec::Trt { tf32: true, opt_level: Some(3), workspace_mib: Some(512) }
    );
    assert_eq!(
        BackendSpec::parse("trt,tf32=off").unwrap(),
        BackendSpec::Trt { tf32: false, opt_level: None, workspace_mib: None }
    );
    assert!(err("trt,tf32=no").contains("tf32 must be on or off"));
    // A repeated option is refused, not silently overridden by its last value.
    assert!(err("ort:cpu,threads=1,threads=2").contains("option 'threads' is given twice"));
    assert!(err("ort:trt,fp16,fp16").contains("option 'fp16' is given twice"));
    assert!(err("trt,opt=2,opt=3").contains("option 'opt' is given twice"));
}

#[test]
fn a_spec_writes_its_canonical_text_which_parses_back_to_it() {
    for (given, canonical) in [
        ("ort:cpu", "ort:cpu"),
        ("ort:cpu,typed=on,opt=all", "ort:cpu"),
        ("ort:cpu,typed=off,threads=2,opt=basic", "ort:cpu,opt=basic,threads=2,typed=off"),
        ("ort:cuda,device=1,tf32=off", "ort:cuda,tf32=off,device=1"),
        ("ort:cuda,conv_search=heuristic", "ort:cuda,conv_search=heuristic"),
        ("ort:trt,device=0,fp16", "ort:trt,fp16,device=0"),
        ("ort:nvrtx", "ort:nvrtx"),
        ("sim:fp16", "sim:fp16"),
        ("sim:bf16,threads=3,engine=trt", "sim:bf16,engine=trt,threads=3"),
        ("sim:tf32", "sim:tf32"),
        ("npz:runs/cand", "npz:runs/cand"),
        ("trt,workspace=512,tf32=off,opt=3", "trt,tf32=off,opt=3,workspace=512"),
    ] {
        let spec = BackendSpec::parse(given).unwrap();
        assert_eq!(spec.to_string(), canonical, "{given}");
        assert_eq!(BackendSpec::parse(canonical).unwrap(), spec, "{canonical} parses back");
    }
}

#[test]
fn only_gpu_specs_move_to_a_shard_gpu() {
    let on = |spec: &str, device: u32| {
        BackendSpec::parse(spec).unwrap().on_device(device).map(|s| s.to_string()).map_err(|e| e.to_string())
    };
    assert_eq!(on("ort:cuda,tf32=off", 1).unwrap(), "ort:cuda,tf32=off,device=1");
    assert_eq!(on("ort:trt,fp16", 2).unwrap(), "ort:trt,fp16,device=2");
    assert_eq!(on("ort:cpu", 1).unwrap(), "ort:cpu");
    assert_eq!(on("sim:fp16", 1).unwrap(), "sim:fp16");
    assert!(on("ort:cuda,device=3", 1).unwrap_err().contains("names its own device"));
    assert!(
        on("ort:cuda,device=0", 1).unwrap_err().contains("names its own device"),
        "an explicit device=0 is named too"
    );
    assert!(on("trt", 1).unwrap_err().contains("takes no device"));
}

#[test]
fn tensors_round_trip_through_little_endian_bytes() {
    use half::f16;
    use layerwise_runtime::{DType, Tensor, TensorData};
    for t in [
        Tensor::f32(vec![2, 2], vec![1.0, -2.5, f32::INFINITY, 0.0]),
        Tensor::new(vec![3], TensorData::F16(vec![f16::from_f32(1.5), f16::MAX, f16::from_f32(-0.0)])),
        Tensor::new(vec![2], TensorData::I64(vec![-1, 1 << 40])),
        Tensor::new(vec![3], TensorData::Bool(vec![true, false, true])),
    ] {
        let bytes = t.to_le_bytes();
        assert_eq!(bytes.len(), t.size_bytes());
        assert_eq!(Tensor::from_le_bytes(t.dtype(), t.shape.clone(), &bytes).unwrap(), t);
    }
    assert!(Tensor::from_le_bytes(DType::F32, vec![3], &[0u8; 8]).is_none(), "a short buffer is refused");
}
