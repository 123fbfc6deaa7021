//! Hugging Face export: tensor names, shapes and dtypes in model.safetensors, config.json fields,
//! the tokenizer written as tokenizer.json, tokenizer_config.json's BOS settings, atomic writes,
//! the RoPE row permutation, and rejection of incomplete tensor sets.

use flamia_eval::export::{
    expected_shapes, interleaved_to_half, write_hf, HfConfig, RopeScaling, Tensor, TokenizerConfig,
};
use std::collections::BTreeMap;

fn cfg(tied: bool) -> HfConfig {
    HfConfig {
        vocab_size: 50,
        hidden_size: 16,
        intermediate_size: 48,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 4,
        max_position_embeddings: 64,
        rms_norm_eps: 1e-5,
        rope_theta: 500000.0,
        rope_scaling: Some(RopeScaling {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        }),
        tie_word_embeddings: tied,
        bos_token_id: Some(1),
        eos_token_id: Some(2),
    }
}

fn tensors(cfg: &HfConfig) -> BTreeMap<String, Tensor> {
    expected_shapes(cfg)
        .into_iter()
        .map(|(k, shape)| {
            let n: usize = shape.iter().product();
            let vals: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
            (k, Tensor::from_f32(shape, &vals).unwrap())
        })
        .collect()
}

#[test]
fn names_and_shapes_follow_llama() {
    let s = expected_shapes(&cfg(false));
    assert_eq!(s.len(), 3 + 2 * 9);
    assert_eq!(s["model.embed_tokens.weight"], vec![50, 16]);
    assert_eq!(s["lm_head.weight"], vec![50, 16]);
    assert_eq!(s["model.layers.1.self_attn.q_proj.weight"], vec![16, 16]);
    assert_eq!(s["model.layers.1.self_attn.k_proj.weight"], vec![8, 16]);
    assert_eq!(s["model.layers.0.self_attn.v_proj.weight"], vec![8, 16]);
    assert_eq!(s["model.layers.0.self_attn.o_proj.weight"], vec![16, 16]);
    assert_eq!(s["model.layers.0.mlp.gate_proj.weight"], vec![48, 16]);
    assert_eq!(s["model.layers.0.mlp.up_proj.weight"], vec![48, 16]);
    assert_eq!(s["model.layers.0.mlp.down_proj.weight"], vec![16, 48]);
    assert_eq!(s["model.layers.0.input_layernorm.weight"], vec![16]);
    assert_eq!(s["model.layers.0.post_attention_layernorm.weight"], vec![16]);
    assert_eq!(s["model.norm.weight"], vec![16]);
    assert!(!expected_shapes(&cfg(true)).contains_key("lm_head.weight"));
}

#[test]
fn writes_safetensors_config_and_tokenizer() {
    let c = cfg(true);
    let t = tensors(&c);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("hf");
    // A stale tokenizer.json of an earlier export is replaced.
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("tokenizer.json"), "{\"stale\":true}").unwrap();
    let tok = serde_json::json!({"model": {"type": "BPE"}, "post_processor": null});
    write_hf(&c, &t, &out, &tok).unwrap();
    let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<&str> = st.names();
    names.sort();
    let want: Vec<String> = expected_shapes(&c).into_keys().collect();
    assert_eq!(names, want.iter().map(String::as_str).collect::<Vec<_>>());
    let q = st.tensor("model.layers.0.self_attn.q_proj.weight").unwrap();
    assert_eq!(q.dtype(), safetensors::Dtype::BF16);
    assert_eq!(q.shape(), &[16, 16]);
    // Element 3 is 1.5 = bf16 0x3fc0.
    assert_eq!(&q.data()[6..8], &0x3fc0u16.to_le_bytes());
    let cfg_json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg_json["architectures"][0], "LlamaForCausalLM");
    assert_eq!(cfg_json["num_key_value_heads"], 2);
    assert_eq!(cfg_json["tie_word_embeddings"], true);
    assert_eq!(cfg_json["rope_scaling"]["rope_type"], "llama3");
    assert_eq!(cfg_json["rope_theta"], 500000.0);
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("tokenizer.json")).unwrap()).unwrap();
    assert_eq!(written, tok);
    let mut files: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        ["config.json", "model.safetensors", "tokenizer.json"],
        "no .tmp left"
    );
}

#[test]
fn a_failed_export_leaves_the_earlier_files_whole() {
    let c = cfg(false);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("hf");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("model.safetensors"), b"earlier export").unwrap();
    // The temporary file cannot be created (a directory is in the way): the write fails.
    std::fs::create_dir(out.join("model.safetensors.tmp")).unwrap();
    let e = write_hf(&c, &tensors(&c), &out, &serde_json::json!({})).unwrap_err();
    assert!(e.to_string().contains("model.safetensors"), "{e}");
    assert_eq!(
        std::fs::read(out.join("model.safetensors")).unwrap(),
        b"earlier export"
    );
}

#[test]
fn tokenizer_config_says_whether_bos_is_added() {
    let dir = tempfile::tempdir().unwrap();
    let read = |t: &TokenizerConfig| -> serde_json::Value {
        t.write(dir.path()).unwrap();
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("tokenizer_config.json")).unwrap())
            .unwrap()
    };
    let with = TokenizerConfig {
        bos_token: Some("<|begin_of_text|>".into()),
        eos_token: "<|end_of_text|>".into(),
        model_max_length: 64,
    };
    let v = read(&with);
    assert_eq!(v["bos_token"], "<|begin_of_text|>");
    assert_eq!(v["add_bos_token"], true);
    assert_eq!(v["add_eos_token"], false);
    assert_eq!(v["eos_token"], "<|end_of_text|>");
    let v = read(&TokenizerConfig {
        bos_token: None,
        ..with
    });
    assert_eq!(v["bos_token"], serde_json::Value::Null);
    assert_eq!(v["add_bos_token"], false);
    assert!(!dir.path().join("tokenizer_config.json.tmp").exists());
}

#[test]
fn incomplete_or_misshapen_sets_are_rejected() {
    let c = cfg(false);
    let mut t = tensors(&c);
    t.remove("lm_head.weight");
    t.insert(
        "model.layers.0.mlp.up_proj.weight".into(),
        Tensor::from_f32(vec![16, 48], &[0.0; 768]).unwrap(),
    );
    t.insert("extra.weight".into(), Tensor::from_f32(vec![1], &[0.0]).unwrap());
    let e = write_hf(
        &c,
        &t,
        tempfile::tempdir().unwrap().path(),
        &serde_json::json!({}),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("missing [\"lm_head.weight\"]"), "{e}");
    assert!(e.contains("unexpected [\"extra.weight\"]"), "{e}");
    assert!(e.contains("up_proj.weight: [16, 48], want [48, 16]"), "{e}");
}

#[test]
fn rope_permutation_matches_transformers_convention() {
    // 2 heads of dim 4, 1 input column; row r holds value r. transformers' conversion
    // w.view(heads, hd/2, 2, in).transpose(1, 2).reshape(...) maps rows [0,1,2,3] -> [0,2,1,3].
    let t = Tensor::from_f32(vec![8, 1], &[0., 1., 2., 3., 4., 5., 6., 7.]).unwrap();
    let p = interleaved_to_half(&t, 2, 4).unwrap();
    let vals: Vec<f32> = p
        .data
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(vals, vec![0., 2., 1., 3., 4., 6., 5., 7.]);
    assert!(interleaved_to_half(&t, 3, 4).is_err());
}

#[test]
fn trainer_checkpoint_names_map_to_hf() {
    use flamia_eval::export::flamia::{read_safetensors, to_hf};
    let c = cfg(false);
    // Build the trainer's names with the shapes the model creates.
    let mut t = BTreeMap::new();
    let mut put = |name: String, shape: Vec<usize>| {
        let n: usize = shape.iter().product();
        let vals: Vec<f32> = (0..n).map(|i| i as f32).collect();
        t.insert(name, Tensor::from_f32(shape, &vals).unwrap());
    };
    put("tok_embeddings.weight".into(), vec![50, 16]);
    put("output.weight".into(), vec![50, 16]);
    put("norm.weight".into(), vec![16]);
    for i in 0..2 {
        put(format!("layers.{i}.attention.wq.weight"), vec![16, 16]);
        put(format!("layers.{i}.attention.wk.weight"), vec![8, 16]);
        put(format!("layers.{i}.attention.wv.weight"), vec![8, 16]);
        put(format!("layers.{i}.attention.wo.weight"), vec![16, 16]);
        put(format!("layers.{i}.feed_forward.w1.weight"), vec![48, 16]);
        put(format!("layers.{i}.feed_forward.w2.weight"), vec![16, 48]);
        put(format!("layers.{i}.feed_forward.w3.weight"), vec![48, 16]);
        put(format!("layers.{i}.attention_norm.weight"), vec![16]);
        put(format!("layers.{i}.ffn_norm.weight"), vec![16]);
    }
    // Round trip through a safetensors file like the trainer's checkpoint.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let views: Vec<(String, safetensors::tensor::TensorView)> = t
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, v.shape.clone(), &v.data)
                    .unwrap(),
            )
        })
        .collect();
    safetensors::tensor::serialize_to_file(views, None, &path).unwrap();
    let read = read_safetensors(&path).unwrap();
    assert_eq!(read, t);
    let hf = to_hf(&c, read).unwrap();
    let want: Vec<String> = expected_shapes(&c).into_keys().collect();
    assert_eq!(hf.keys().cloned().collect::<Vec<_>>(), want);
    for (k, s) in expected_shapes(&c) {
        assert_eq!(hf[&k].shape, s, "{k}");
    }
    // w1 is the gate (unpermuted), wk rows are permuted per KV head (head_dim 4: rows 0,2,1,3).
    assert_eq!(
        hf["model.layers.0.mlp.gate_proj.weight"],
        t["layers.0.feed_forward.w1.weight"]
    );
    let k = &hf["model.layers.1.self_attn.k_proj.weight"];
    let row = |r: usize| f32::from_le_bytes(k.data[r * 64..r * 64 + 4].try_into().unwrap());
    assert_eq!([row(0), row(1), row(2), row(3)], [0.0, 32.0, 16.0, 48.0]);
    write_hf(&c, &hf, &dir.path().join("hf"), &serde_json::json!({})).unwrap();
    let mut bad = BTreeMap::new();
    bad.insert(
        "layers.0.attention.wz.weight".to_string(),
        Tensor::from_f32(vec![1], &[0.0]).unwrap(),
    );
    assert!(to_hf(&c, bad)
        .unwrap_err()
        .to_string()
        .contains("no LlamaForCausalLM counterpart"));
}
