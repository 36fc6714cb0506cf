//! Policies, hardware and model shapes through their files (serde round trips).

use super::search::small_space;
use super::*;

#[test]
fn profile_json_round_trip_and_clear_errors() {
    let dir = std::env::temp_dir().join(format!("burn-offload-policy-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t4.json");
    let hw = HardwareProfile::t4_like();
    hw.save_json(&path).unwrap();
    assert_eq!(HardwareProfile::load_json(&path).unwrap(), hw);

    let missing = HardwareProfile::load_json(dir.join("nope.json")).unwrap_err();
    assert!(matches!(missing, ProfileError::Io { .. }), "{missing}");
    assert!(missing.to_string().contains("nope.json"));

    std::fs::write(&path, "{ \"gpu_memory_bytes\": 1 }").unwrap();
    let parse = HardwareProfile::load_json(&path).unwrap_err();
    assert!(matches!(parse, ProfileError::Parse { .. }), "{parse}");
    assert!(parse.to_string().contains("missing field"), "{parse}");

    let mut v: serde_json::Value = serde_json::from_str(&hw.to_json_string().unwrap()).unwrap();
    v["pcie_speed"] = serde_json::json!(3);
    std::fs::write(&path, v.to_string()).unwrap();
    let unknown = HardwareProfile::load_json(&path).unwrap_err();
    assert!(unknown.to_string().contains("unknown field"), "{unknown}");

    let bad = HardwareProfile { disk_to_cpu_bandwidth: -1.0, ..hw };
    let err = HardwareProfile::from_json_str(&serde_json::to_string(&bad).unwrap()).unwrap_err();
    assert!(matches!(err, ProfileError::Invalid { field: "disk_to_cpu_bandwidth", .. }), "{err}");
    assert!(bad.save_json(&path).is_err());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn policy_and_results_serialize() {
    let r =
        search(&HardwareProfile::t4_like(), &ModelShape::opt_6_7b(), &OffloadWorkload::new(256, 32), &small_space())
            .unwrap();
    let json = serde_json::to_string(&r).unwrap();
    let back: SearchResult = serde_json::from_str(&json).unwrap();
    // serde_json's default float parsing may differ in the last bit.
    assert_eq!(back.policy.shape, r.policy.shape);
    for (a, b) in back.policy.placement_vector().iter().zip(r.policy.placement_vector()) {
        assert_close!(*a, b, 1e-15);
    }
    assert_eq!(back.binding.tight_memory, r.binding.tight_memory);
    let p: Policy =
        serde_json::from_str(&serde_json::to_string(&Policy::deepspeed_like(4, Tier::Cpu)).unwrap()).unwrap();
    assert_eq!(p, Policy::deepspeed_like(4, Tier::Cpu));
    let m: ModelShape = serde_json::from_str(&serde_json::to_string(&ModelShape::llama3_8b()).unwrap()).unwrap();
    assert_eq!(m, ModelShape::llama3_8b());
}

/// Compression settings serialize as `{"bits", "group_size"}` (the shape of policy files before
/// they held `QuantSpec`s), come back along their kind's axis, and are checked when read.
#[test]
fn compression_serializes_as_bits_and_group_size() {
    let mut policy = Policy::all_on_gpu(1);
    (policy.shape.compress_weights, policy.shape.compress_cache) = (Some(FLEXGEN_WEIGHTS), Some(FLEXGEN_CACHE));
    let shape = policy.shape;
    let json = serde_json::to_string(&policy).unwrap();
    assert!(
        json.ends_with(r#""compress_weights":{"bits":4,"group_size":64},"compress_cache":{"bits":4,"group_size":64}}"#),
        "{json}"
    );
    assert_eq!(serde_json::from_str::<Policy>(&json).unwrap(), policy);
    assert_eq!(serde_json::from_str::<PolicyShape>(&serde_json::to_string(&shape).unwrap()).unwrap(), shape);
    let uncompressed = serde_json::to_string(&Policy::all_on_gpu(1)).unwrap();
    assert!(uncompressed.ends_with(r#""compress_weights":null,"compress_cache":null}"#), "{uncompressed}");
    let space = SearchSpace::default().with_compression();
    let json = serde_json::to_string(&space).unwrap();
    assert!(json.contains(r#""cache_compression":[null,{"bits":4,"group_size":64}]"#), "{json}");
    assert_eq!(serde_json::from_str::<SearchSpace>(&json).unwrap(), space);

    let three_bits = json.replacen(r#"{"bits":4"#, r#"{"bits":3"#, 1);
    let err = serde_json::from_str::<SearchSpace>(&three_bits).unwrap_err().to_string();
    assert!(err.contains("3-bit"), "{err}");
    let bad_group = serde_json::to_string(&policy).unwrap().replacen(r#""group_size":64"#, r#""group_size":6"#, 1);
    assert!(serde_json::from_str::<Policy>(&bad_group).unwrap_err().to_string().contains("group size 6"));
}
