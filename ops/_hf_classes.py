"""transformers classes that ``ops.nn.convert`` knows by name (module path and class name, so
transformers need not be imported), each with what it computes. Names are ``<model folder>.<class>``:
the class ``<class>`` of ``transformers.models.<model folder>.modeling_<model folder>``, or
``<model folder>.<module>.<class>`` for another modeling module of the folder. Listed from transformers
5.25 (whose BailingHybridMLP clamps its gate and up products, so it is not listed):
tests/test_hf_class_lists.py checks that each list holds exactly the classes of the installed
transformers whose own forward is the reference class's, and tests/test_models.py runs every listed class
against its converted module, so a class whose formula changes in a later release fails a test instead
of converting silently. On the user's transformers, ``formula_changed`` compares each listed class's own
forward with the formula its list was written for, so that ``ops.nn.convert`` leaves a class alone (and
says so) whose forward a release has changed since, instead of converting it silently.
"""

import ast
import functools
import inspect
import sys
import textwrap
from typing import Optional, Tuple

import torch


class ClassList(frozenset):
    """{(module, qualname)} of the listed classes, with ``formulas``: the source of the forward they all
    run, as the list's reference class writes it (one or more spellings)."""

    formulas: Tuple[str, ...]

    def __new__(cls, keys, formulas: Tuple[str, ...]):
        self = super().__new__(cls, keys)
        self.formulas = formulas
        return self


def _classes(names: str, *formulas: str) -> ClassList:
    """The ClassList of whitespace-separated names: ``folder.Class`` (in ``modeling_<folder>``) or
    ``folder.module.Class`` (another modeling module of the folder, as ``data2vec.modeling_data2vec_text``)."""
    keys = set()
    for name in names.split():
        parts = name.split(".")
        folder, module, cls = (parts[0], f"modeling_{parts[0]}", parts[1]) if len(parts) == 2 else parts
        keys.add((f"transformers.models.{folder}.{module}", cls))
    return ClassList(keys, tuple(textwrap.dedent(f) for f in formulas))


class _Rename(ast.NodeTransformer):
    def __init__(self, names):
        self.names = names

    def visit_Name(self, node):
        node.id = self.names.get(node.id, node.id)
        return node

    def visit_arg(self, node):
        node.arg, node.annotation = self.names.get(node.arg, node.arg), None
        return node


def normalized_forward(source: str) -> str:
    """ast.dump of a function's source without its docstring, annotations, argument and local names (by
    position instead) and with a trailing ``v = e; return v`` as ``return e``; decorators kept."""
    node = ast.parse(textwrap.dedent(source)).body[0]
    node.name, node.returns = "forward", None
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    if (len(body) >= 2 and isinstance(body[-1], ast.Return) and isinstance(body[-1].value, ast.Name)
            and isinstance(body[-2], ast.Assign) and len(body[-2].targets) == 1
            and isinstance(body[-2].targets[0], ast.Name) and body[-2].targets[0].id == body[-1].value.id):
        body = body[:-2] + [ast.Return(body[-2].value)]
    node.body = body
    args = node.args
    names = {}
    for arg in args.posonlyargs + args.args + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a]:
        names[arg.arg] = "self" if arg.arg == "self" else f"arg{len(names)}"
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id not in names:
            names[n.id] = f"local{len(names)}"
    return ast.dump(_Rename(names).visit(node), annotate_fields=False)


@functools.lru_cache(maxsize=None)
def _normalized_formulas(formulas: Tuple[str, ...]) -> frozenset:
    return frozenset(normalized_forward(f) for f in formulas)


@functools.lru_cache(maxsize=None)
def _formula_changed(cls: type, formulas: Tuple[str, ...]) -> Optional[str]:
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return f"{cls.__qualname__}.forward has no source to compare with the formula ops fuses"
    if normalized_forward(source) in _normalized_formulas(formulas):
        return None
    version = getattr(sys.modules.get("transformers"), "__version__", "?")
    return (f"{cls.__qualname__}.forward in transformers {version} is not the formula ops fuses for its class "
            "list (a release changed it)")


def formula_changed(cls: type, classes: ClassList) -> Optional[str]:
    """For a class of `classes`: None if its own forward is their formula (compared as
    ``normalized_forward`` source, once per class), else why not (transformers changed it, or it has no
    source)."""
    return _formula_changed(cls, classes.formulas)


def _bound_to(fn, module, funcs) -> bool:
    """Whether `fn` calls one of `funcs` on `module`: a method bound to it or ``functools.partial(func,
    module)`` (how ``ops.recipes.apply`` sets a recipe)."""
    if isinstance(fn, functools.partial):
        return len(fn.args) == 1 and fn.args[0] is module and not fn.keywords and fn.func in funcs
    return getattr(fn, "__self__", None) is module and getattr(fn, "__func__", None) in funcs


def class_key(module: torch.nn.Module, accept=()):
    """(module path, qualname) of a module's class, if the module runs the class's own forward (not one
    patched onto the class; on the instance, only that same forward or one of the functions in `accept`,
    bound to the module), else None."""
    cls = type(module)
    forward = getattr(cls, "forward", None)
    if (getattr(forward, "__qualname__", None) != f"{cls.__qualname__}.forward"
            or getattr(forward, "__module__", None) != cls.__module__):
        return None
    own = vars(module).get("forward")
    if own is not None and not _bound_to(own, module, (forward, *accept)):
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
    kimi_linear.KimiLinearRMSNorm kolibri1.Kolibri1RMSNorm kolibri1_1.Kolibri1_1RMSNorm laguna.LagunaRMSNorm lfm2.Lfm2RMSNorm
    lfm2_moe.Lfm2MoeRMSNorm lfm3.Lfm3RMSNorm lfm3_vl.Lfm3VlVisionRMSNorm lighton_ocr.LightOnOcrRMSNorm
    llama.LlamaRMSNorm longcat_flash.LongcatFlashRMSNorm mamba.MambaRMSNorm mamba2.Mamba2RMSNorm
    mellum.MellumRMSNorm mimo_v2_flash.MiMoV2FlashRMSNorm minicpm3.MiniCPM3RMSNorm minicpm5_moe.MiniCPM5MoeRMSNorm minimax.MiniMaxRMSNorm
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
""", """
    def forward(self, hidden_states):  # LlamaRMSNorm's
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)
""")

# The same x_hat, then ``(weight * x_hat).to(input_dtype)`` (Olmo2: one rounding to the input's dtype).
RMS_NORM_CAST = _classes("""
    afmoe.AfmoeRMSNorm beam.BeamRMSNorm deepseek_v4.DeepseekV4RMSNorm flex_olmo.FlexOlmoRMSNorm
    flint.FlintRMSNorm gpt_oss.GptOssRMSNorm helium.HeliumRMSNorm inkling2.Inkling2RMSNorm
    inkling2_loop.Inkling2LoopRMSNorm lara_mini.LaraMiniRMSNorm nemotron_h.NemotronHRMSNorm
    nemotron_h_omni.NemotronH_Omni_RMSNorm olmo2.Olmo2RMSNorm olmo3.Olmo3RMSNorm
    olmo_hybrid.OlmoHybridRMSNorm openai_privacy_filter.OpenAIPrivacyFilterRMSNorm
""", """
    def forward(self, hidden_states):  # Olmo2RMSNorm's
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return (self.weight * hidden_states).to(input_dtype)
""", """
    def forward(self, hidden_states):  # HeliumRMSNorm's
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return (self.weight.to(torch.float32) * hidden_states).to(input_dtype)
""")


# Blocks of the ``ops.recipes`` recipes, by the forward they run (recipes.py says what each fuses).
# ``dense_act``: ``intermediate_act_fn(dense(x))``, as BertIntermediate.
DENSE_ACT = _classes("""
    align.AlignTextIntermediate altclip.AltRobertaIntermediate bert.BertIntermediate
    bert_generation.BertGenerationIntermediate big_bird.BigBirdIntermediate
    blip.modeling_blip_text.BlipTextIntermediate blip_2.Blip2QFormerIntermediate
    bridgetower.BridgeTowerIntermediate bros.BrosIntermediate camembert.CamembertIntermediate
    canine.CanineIntermediate chinese_clip.ChineseCLIPTextIntermediate clap.ClapAudioIntermediate
    clap.ClapTextIntermediate convbert.ConvBertIntermediate cpmant.CpmAntIntermediate
    data2vec.modeling_data2vec_text.Data2VecTextIntermediate
    data2vec.modeling_data2vec_vision.Data2VecVisionIntermediate deberta.DebertaIntermediate
    deberta_v2.DebertaV2Intermediate dinat.DinatIntermediate donut.modeling_donut_swin.DonutSwinIntermediate
    dpt.DPTViTIntermediate electra.ElectraIntermediate ernie.ErnieIntermediate flava.FlavaIntermediate
    fnet.FNetIntermediate git.GitIntermediate instructblip.InstructBlipQFormerIntermediate
    instructblipvideo.InstructBlipVideoQFormerIntermediate layoutlm.LayoutLMIntermediate
    layoutlmv2.LayoutLMv2Intermediate layoutlmv3.LayoutLMv3Intermediate lilt.LiltIntermediate
    longformer.LongformerIntermediate luke.LukeIntermediate lxmert.LxmertIntermediate
    markuplm.MarkupLMIntermediate maskformer.modeling_maskformer_swin.MaskFormerSwinIntermediate
    megatron_bert.MegatronBertIntermediate mobilebert.MobileBertIntermediate mobilevit.MobileViTIntermediate
    mpnet.MPNetIntermediate mra.MraIntermediate nystromformer.NystromformerIntermediate
    pp_doclayout_v2.PPDocLayoutV2ReadingOrderIntermediate rembert.RemBertIntermediate
    roberta.RobertaIntermediate roc_bert.RoCBertIntermediate roformer.RoFormerIntermediate
    sew_d.SEWDIntermediate splinter.SplinterIntermediate swin2sr.Swin2SRIntermediate
    swinv2.Swinv2Intermediate tapas.TapasIntermediate tvp.TvpIntermediate videomae.VideoMAEIntermediate
    vilt.ViltIntermediate visual_bert.VisualBertIntermediate xlm_roberta.XLMRobertaIntermediate
    xlm_roberta_xl.XLMRobertaXLIntermediate xmod.XmodIntermediate yolos.YolosIntermediate
    yoso.YosoIntermediate
""", """
    def forward(self, hidden_states):  # BertIntermediate's
        hidden_states = self.dense(hidden_states)
        hidden_states = self.intermediate_act_fn(hidden_states)
        return hidden_states
""")

# ``gated_mlp``: ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``, as LlamaMLP.
GATED_MLP = _classes("""
    afmoe.AfmoeMLP aimv2.Aimv2MLP aria.AriaSharedExpertsMLP axk1.AXK1MLP axk2.AXK2MLP
    bamba.BambaMLP blt.BltMLP chameleon.ChameleonMLP cohere.CohereMLP
    cohere2.Cohere2MLP cohere2_moe.Cohere2MoeMLP cohere_compass.CohereCompassMLP csm.CsmMLP cwm.CwmMLP
    deepseek_ocr2.DeepseekOcr2TextMLP deepseek_ocr2.DeepseekOcr2VisionMLP deepseek_v2.DeepseekV2MLP
    deepseek_v3.DeepseekV3MLP deepseek_v32.DeepseekV32MLP deimv2.Deimv2SwiGLUFFN diffllama.DiffLlamaMLP
    diffusion_gemma.DiffusionGemmaText4MLP dinov2.Dinov2SwiGLUFFN
    dinov2_with_registers.Dinov2WithRegistersSwiGLUFFN dinov3_vit.DINOv3ViTGatedMLP doge.DogeMLP
    dots1.Dots1MLP dots3_note.Dots3NoteTextMLP dots3_note.Dots3NoteVisionMLP
    embedding_gemma2.EmbeddingGemma2MLP emu3.Emu3MLP eomt.EomtSwiGLUFFN eomt_dinov3.EomtDinov3GatedMLP
    ernie4_5.Ernie4_5MLP ernie4_5_moe.Ernie4_5_MoeMLP ernie4_5_vl_moe.Ernie4_5_VLMoeMLP esmc.EsmcMLP
    eurobert.EuroBertMLP evolla.EvollaMLP exaone4.Exaone4MLP exaone4_5.Exaone4_5_MLP exaone_moe.ExaoneMoeMLP
    flex_olmo.FlexOlmoMLP flint.FlintMLP gemma.GemmaMLP gemma2.Gemma2MLP gemma3.Gemma3MLP
    gemma4.Gemma4TextMLP gemma4_unified.Gemma4UnifiedTextMLP glm4_moe.Glm4MoeMLP
    glm4_moe_lite.Glm4MoeLiteMLP glm4v.Glm4VisionMlp glm4v_moe.Glm4vMoeisionMlp glm4v_moe.Glm4vMoeTextMLP
    glm_moe_dsa.GlmMoeDsaMLP glm_ocr.GlmOcrVisionMlp granite.GraniteMLP
    granite4_vision.Granite4VisionTextMLP granite_docling.GraniteDoclingTextMLP granite_swa.GraniteSWAMLP
    helium.HeliumMLP higgs_audio_v2.HiggsAudioV2MLP hrm_text.HrmTextMLP hunyuan_v1_dense.HunYuanDenseV1MLP
    hunyuan_v1_moe.HunYuanMoEV1MLP hunyuan_vl.HunYuanVLMLP hy_v3.HYV3MLP hy_v4.HYV4MLP hy_v4_vl.HYV4VLMLP
    hyperclovax.HyperCLOVAXMLP idefics.IdeficsMLP idefics2.Idefics2MLP jamba.JambaMLP
    kimi_linear.KimiLinearMLP kolibri1.Kolibri1MLP kolibri1_1.Kolibri1_1MLP laguna.LagunaMLP lara_mini.LaraMiniMLP llama.LlamaMLP
    longcat_flash.LongcatFlashMLP mellum.MellumMLP mimo_v2_flash.MiMoV2FlashMLP minicpm3.MiniCPM3MLP minicpm5_moe.MiniCPM5MoeMLP
    ministral.MinistralMLP ministral3.Ministral3MLP mistral.MistralMLP mistral4.Mistral4MLP
    mistral_large4.MistralLarge4TextMLP mllama.MllamaTextMLP molmo2.Molmo2ImageProjectorMLP molmo2.Molmo2MLP
    moonshine_streaming.MoonshinMoonshineStreamingDecoderMLP muse_glimmer.MuseGlimmerTextMLP
    muse_glimmer_assistant.MuseGlimmerAssistantMLP muse_spark.MuseSparkTextMLP nomic_bert.NomicBertMLP
    olmo.OlmoMLP olmo2.Olmo2MLP olmo3.Olmo3MLP olmo_hybrid.OlmoHybridMLP olmoe.OlmoeMLP ovis2.Ovis2MLP
    ovis2.Ovis2VisionMLP paddleocr_vl.PaddleOCRMLP pe_audio.PeAudioEncoderMLP
    pe_audio_video.PeAudioVideoEncoderMLP pe_video.PeVideoEncoderMLP pi05.PI05MLP pixtral.PixtralMLP qwen2.Qwen2MLP
    qwen2_5_omni.Qwen2_5OmniMLP qwen2_5_omni.Qwen2MLP qwen2_5_vl.Qwen2_5_VLMLP qwen2_5_vl.Qwen2MLP
    qwen2_moe.Qwen2MoeMLP qwen2_vl.Qwen2MLP qwen3.Qwen3MLP qwen3_5.Qwen3_5MLP qwen3_5_moe.Qwen3_5MoeMLP
    qwen3_moe.Qwen3MoeMLP qwen3_next.Qwen3NextMLP qwen3_omni_moe.Qwen3OmniMoeCode2WavMlp
    qwen3_omni_moe.Qwen3OmniMoeMLP qwen3_omni_moe.Qwen3OmniMoeTalkerTextMLP
    qwen3_omni_moe.Qwen3OmniMoeThinkerTextMLP qwen3_vl.Qwen3VLTextMLP qwen3_vl_moe.Qwen3VLMoeTextMLP
    qwen4_exp.Qwen4ExpTextMLP radio.RadioSwiGLUFFN rf_detr.RfDetrDinov2SwiGLUFFN sapiens2.Sapiens2GatedMLP
    smollm3.SmolLM3MLP solar_open.SolarOpenMLP stablelm.StableLmMLP tipsv2.Tipsv2VisionSwiGLUFFN
    ultrabert.UltrabertMLP unlimited_ocr.UnlimitedOcrTextMLP vaultgemma.VaultGemmaMLP vibevoice.VibeVoiceMLP
    videomt.VideomtGatedMLP videomt.VideomtSwiGLUFFN voxtral_realtime.VoxtralRealtimeMLP
    voxtral_realtime.VoxtralRealtimeTextMLP youtu.YoutuMLP zamba.ZambaMLP
""", """
    def forward(self, x):  # LlamaMLP's
        down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        return down_proj
""")

# ``gate_up_mlp``: ``gate, up = gate_up_proj(x).chunk(2, dim=-1); down_proj(up * activation_fn(gate))``, as Phi3MLP.
GATE_UP_MLP = _classes("""
    dia.DiaMLP dots3_note.Dots3NoteAudioMLP esmfold2.EsmFold2SwiGLU glm.GlmMLP glm4.Glm4MLP
    glm4v.Glm4vTextMLP glm_image.GlmImageTextMLP glm_ocr.GlmOcrTextMLP phi3.Phi3MLP
    phi4_multimodal.Phi4MultimodalMLP
""", """
    def forward(self, hidden_states):  # Phi3MLP's
        up_states = self.gate_up_proj(hidden_states)
        gate, up_states = up_states.chunk(2, dim=-1)
        up_states = up_states * self.activation_fn(gate)
        return self.down_proj(up_states)
""")
