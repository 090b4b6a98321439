"""transformers classes that ``ops.nn.convert`` knows by name (module path and class name, so
transformers need not be imported), each with what it computes. Names are ``<model folder>.<class>``:
the class ``<class>`` of ``transformers.models.<model folder>.modeling_<model folder>``. Listed from
transformers 5.24; tests/test_models.py checks every listed class that the installed transformers has
against its converted module, so a class whose formula changes in a later release fails a test instead
of converting silently.
"""

import torch


def _classes(names: str) -> frozenset:
    """{(module, qualname)} of whitespace-separated ``folder.Class`` names."""
    return frozenset((f"transformers.models.{folder}.modeling_{folder}", cls)
                     for folder, cls in (name.split(".") for name in names.split()))


def class_key(module: torch.nn.Module, accept=()):
    """(module path, qualname) of a module's class, if the module runs the class's own forward (not one
    patched onto the class; on the instance, only that same forward bound, as unpickling sets it, or
    one of the functions in `accept`), else None."""
    cls = type(module)
    forward = getattr(cls, "forward", None)
    if (getattr(forward, "__qualname__", None) != f"{cls.__qualname__}.forward"
            or getattr(forward, "__module__", None) != cls.__module__):
        return None
    own = vars(module).get("forward")
    if own is not None and (getattr(own, "__self__", None) is not module
                            or getattr(own, "__func__", None) not in (forward, *accept)):
        return None
    return cls.__module__, cls.__qualname__


# RMSNorms computing x_hat = x.float() * rsqrt(x.float().pow(2).mean(-1, keepdim=True) + variance_epsilon),
# then ``weight * x_hat.to(input_dtype)`` (Llama: the weight multiply in the promoted dtype).
RMS_NORM_LLAMA = _classes("""
    aimv2.Aimv2RMSNorm apertus.ApertusRMSNorm apertus1p5.Apertus1p5TextRMSNorm arcee.ArceeRMSNorm
    aria.AriaTextRMSNorm axk1.AXK1RMSNorm axk2.AXK2RMSNorm bailing_hybrid.BailingHybridRMSNorm
    bamba.BambaRMSNorm bitnet.BitNetRMSNorm blt.BltRMSNorm chameleon.ChameleonRMSNorm clvp.ClvpRMSNorm
    cohere2_moe.Cohere2MoeRMSNorm cosmos3_edge.Cosmos3EdgeTextRMSNorm csm.CsmRMSNorm cwm.CwmRMSNorm
    deepseek_ocr2.DeepseekOcr2VisionRMSNorm deepseek_ocr2.DeepseekOcr2TextRMSNorm
    deepseek_v2.DeepseekV2RMSNorm deepseek_v3.DeepseekV3RMSNorm deepseek_v32.DeepseekV32RMSNorm
    deimv2.Deimv2RMSNorm dia.DiaRMSNorm diffllama.DiffLlamaRMSNorm doge.DogeRMSNorm dots1.Dots1RMSNorm
    dots3_note.Dots3NoteRMSNorm emu3.Emu3RMSNorm ernie4_5.Ernie4_5RMSNorm ernie4_5_moe.Ernie4_5_MoeRMSNorm
    ernie4_5_vl_moe.Ernie4_5_VLMoeRMSNorm eurobert.EuroBertRMSNorm evolla.EvollaRMSNorm
    exaone4.Exaone4RMSNorm exaone4_5.Exaone4_5_RMSNorm exaone_moe.ExaoneMoeRMSNorm falcon_h1.FalconH1RMSNorm
    falcon_mamba.FalconMambaRMSNorm glm.GlmRMSNorm glm4.Glm4RMSNorm glm4_moe.Glm4MoeRMSNorm
    glm4_moe_lite.Glm4MoeLiteRMSNorm glm4v.Glm4vRMSNorm glm4v_moe.Glm4vMoeTextRMSNorm
    glm4v_moe.Glm4vMoeRMSNorm glm5_next.Glm5NextTextRMSNorm glm5_next.Glm5NextRMSNorm
    glm_image.GlmImageRMSNorm glm_moe_dsa.GlmMoeDsaRMSNorm glm_ocr.GlmOcrRMSNorm granite.GraniteRMSNorm
    granite4_vision.Granite4VisionTextRMSNorm granite_docling.GraniteDoclingTextRMSNorm
    granite_swa.GraniteSWARMSNorm granitemoe.GraniteMoeRMSNorm granitemoe_swa.GraniteMoeSWARMSNorm
    granitemoehybrid.GraniteMoeHybridRMSNorm granitemoeshared.GraniteMoeSharedRMSNorm
    higgs_audio_v2.HiggsAudioV2RMSNorm hunyuan_v1_dense.HunYuanDenseV1RMSNorm
    hunyuan_v1_moe.HunYuanMoEV1RMSNorm hunyuan_vl.HunYuanVLRMSNorm hy_v3.HYV3RMSNorm hy_v4.HYV4RMSNorm
    hy_v4_vl.HYV4VLRMSNorm hyperclovax.HyperCLOVAXRMSNorm idefics2.Idefics2RMSNorm idefics3.Idefics3RMSNorm
    inkling.InklingRMSNorm internvl.InternVLVisionRMSNorm jamba.JambaRMSNorm jetmoe.JetMoeRMSNorm
    kimi_linear.KimiLinearRMSNorm kolibri1.Kolibri1RMSNorm laguna.LagunaRMSNorm lfm2.Lfm2RMSNorm
    lfm2_moe.Lfm2MoeRMSNorm lfm3.Lfm3RMSNorm lfm3_vl.Lfm3VlVisionRMSNorm lighton_ocr.LightOnOcrRMSNorm
    llama.LlamaRMSNorm longcat_flash.LongcatFlashRMSNorm mamba.MambaRMSNorm mamba2.Mamba2RMSNorm
    mellum.MellumRMSNorm mimo_v2_flash.MiMoV2FlashRMSNorm minicpm3.MiniCPM3RMSNorm minimax.MiniMaxRMSNorm
    minimax_m2.MiniMaxM2RMSNorm ministral.MinistralRMSNorm ministral3.Ministral3RMSNorm
    mistral.MistralRMSNorm mistral3.Mistral3RMSNorm mistral4.Mistral4RMSNorm
    mistral_large4.MistralLarge4RMSNorm mixtral.MixtralRMSNorm mllama.MllamaTextRMSNorm molmo2.Molmo2RMSNorm
    muse_glimmer_assistant.MuseGlimmerAssistantRMSNorm neucodec.NeuCodecRMSNorm olmoe.OlmoeRMSNorm
    ovis2.Ovis2RMSNorm paddleocr_vl.PaddleOCRRMSNorm pe_audio.PeAudioEncoderRMSNorm
    pe_audio_video.PeAudioVideoEncoderRMSNorm pe_video.PeVideoEncoderRMSNorm phi3.Phi3RMSNorm
    phi4_multimodal.Phi4MultimodalRMSNorm pixtral.PixtralRMSNorm qianfan_ocr.QianfanOCRVisionRMSNorm
    qwen2.Qwen2RMSNorm qwen2_5_omni.Qwen2_5OmniRMSNorm qwen2_5_vl.Qwen2_5_VLRMSNorm
    qwen2_moe.Qwen2MoeRMSNorm qwen2_vl.Qwen2VLRMSNorm qwen3.Qwen3RMSNorm qwen3_moe.Qwen3MoeRMSNorm
    qwen3_omni_moe.Qwen3OmniMoeThinkerTextRMSNorm qwen3_omni_moe.Qwen3OmniMoeTextRMSNorm
    qwen3_omni_moe.Qwen3OmniMoeRMSNorm qwen3_omni_moe.Qwen3OmniMoeCode2WavRMSNorm
    qwen3_vl.Qwen3VLTextRMSNorm qwen3_vl_moe.Qwen3VLMoeTextRMSNorm sapiens2.Sapiens2RMSNorm
    seed_oss.SeedOssRMSNorm smollm3.SmolLM3RMSNorm solar_open.SolarOpenRMSNorm timesfm.TimesFmRMSNorm
    timesfm2_5.TimesFm2_5RMSNorm ultrabert.UltrabertRMSNorm ultravbert.UltraVBertRMSNorm
    unlimited_ocr.UnlimitedOcrTextRMSNorm vibevoice.VibeVoiceRMSNorm
    vibevoice_acoustic_tokenizer.VibeVoiceAcousticTokenizerRMSNorm vibevoice_asr.VibeVoiceAsrRMSNorm
    voxtral_realtime.VoxtralRealtimeRMSNorm xcodec2.Xcodec2RMSNorm youtu.YoutuRMSNorm zamba.ZambaRMSNorm
    zamba2.Zamba2RMSNorm zaya.ZayaRMSNorm
""")

# The same x_hat, then ``(weight * x_hat).to(input_dtype)`` (Olmo2: one rounding to the input's dtype).
RMS_NORM_CAST = _classes("""
    afmoe.AfmoeRMSNorm beam.BeamRMSNorm deepseek_v4.DeepseekV4RMSNorm flex_olmo.FlexOlmoRMSNorm
    flint.FlintRMSNorm gpt_oss.GptOssRMSNorm helium.HeliumRMSNorm inkling2.Inkling2RMSNorm
    inkling2_loop.Inkling2LoopRMSNorm lara_mini.LaraMiniRMSNorm nemotron_h.NemotronHRMSNorm
    nemotron_h_omni.NemotronH_Omni_RMSNorm olmo2.Olmo2RMSNorm olmo3.Olmo3RMSNorm
    olmo_hybrid.OlmoHybridRMSNorm openai_privacy_filter.OpenAIPrivacyFilterRMSNorm
""")
