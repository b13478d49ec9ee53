"""The built-in chat templates by name, and `get_template`, which picks one for a run.

The slot strings are facts about the models, as LLaMA-Factory 0.9.5 declares them; `qwen2` and `baichuan2`, which
0.9.5 no longer has, follow its earlier releases. `benchmarks/data_throughput.py --template-parity` checks parity."""

from __future__ import annotations

from typing import Any

from tuneline.data.templates import BOS, EOS, Special, Template, template_from_tokenizer
from tuneline.data.tools import TOOL_FORMATS, tool_date
from tuneline.errors import ConfigError, did_you_mean


def _turns(start: str, end: str, eot: str, tool_role: str | None = None, answer_role: str = "assistant") -> dict:
    """Header-style turns `{start}role{end}text{eot}`, the prompt ending in the answer's open header; without a
    tool role, observations are written as user turns."""
    def turn(role: str) -> str:
        return f"{start}{role}{end}{{{{content}}}}{eot}"

    answer = f"{start}{answer_role}{end}"
    slots = dict(user=(turn("user") + answer,), assistant=("{{content}}" + eot,), system=(turn("system"),))
    return slots | (dict(observation=(turn(tool_role) + answer,)) if tool_role else {})


_IM = _turns("<|im_start|>", "\n", "<|im_end|>\n")
_QWEN = dict(_IM, observation=("<|im_start|>user\n<tool_response>\n{{content}}\n</tool_response><|im_end|>\n"
                               "<|im_start|>assistant\n",),
             stop_words=("<|im_end|>",), replace_eos=True, tool_format="qwen")
_QWEN35 = dict(_QWEN, tool_format="qwen3_5")
_GLM4 = dict(user=("<|user|>\n{{content}}<|assistant|>",), assistant=("\n{{content}}",), system=("<|system|>\n{{content}}",),
             function=("{{content}}",), observation=("<|observation|>\n{{content}}<|assistant|>",),
             prefix=("[gMASK]<sop>",), stop_words=("<|user|>", "<|observation|>"), efficient_eos=True)
_MINIMAX1_TURN = "<beginning_of_sentence>{head}\n{{{{content}}}}<end_of_sentence>\n"
_MINIMAX1_ANSWER = "<beginning_of_sentence>ai name=assistant\n"
_GEMMA4_TURN = "<|turn>{role}\n{{{{content}}}}<turn|>\n"
_LLAMA3 = _turns("<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>", tool_role="ipython")
_LLAMA4 = _turns("<|header_start|>", "<|header_end|>\n\n", "<|eot|>", tool_role="ipython")
_GEMMA = dict(_turns("<start_of_turn>", "\n", "<end_of_turn>\n", tool_role="tool", answer_role="model"),
              system=("{{content}}\n\n",), prefix=(BOS,), stop_words=("<end_of_turn>",), replace_eos=True,
              fuse_system=True)
_DEEPSEEK = dict(user=("<｜User｜>{{content}}<｜Assistant｜>",), prefix=(BOS,))
_COHERE_TURN = "<|START_OF_TURN_TOKEN|><|{role}_TOKEN|>{{{{content}}}}<|END_OF_TURN_TOKEN|>"
_INTERNLM_SYSTEM = (
    "You are an AI assistant whose name is InternLM (书生·浦语).\n"
    "- InternLM (书生·浦语) is a conversational language model that is developed by Shanghai AI Laboratory "
    "(上海人工智能实验室). It is designed to be helpful, honest, and harmless.\n"
    "- InternLM (书生·浦语) can understand and communicate fluently in the language "
    "chosen by the user such as English and 中文."
)

TEMPLATES: dict[str, Template] = {t.name: t for t in (
    Template("empty", assistant=("{{content}}",)),
    Template("default", user=("Human: {{content}}", EOS, "\nAssistant:"), assistant=("{{content}}", EOS, "\n"),
             system=("System: {{content}}", EOS, "\n")),
    Template("alpaca", user=("### Instruction:\n{{content}}\n\n### Response:\n",),
             assistant=("{{content}}", EOS, "\n\n"),
             default_system="Below is an instruction that describes a task. "
                            "Write a response that appropriately completes the request.\n\n"),
    Template("chatml", **_turns("<|im_start|>", "\n", "<|im_end|>\n", tool_role="tool"),
             stop_words=("<|im_end|>", "<|im_start|>"), replace_eos=True),
    Template("yi", **_IM, stop_words=("<|im_end|>",)),
    Template("intern2", **_IM, prefix=(BOS,), default_system=_INTERNLM_SYSTEM, stop_words=("<|im_end|>",)),
    Template("qwen", **_QWEN, default_system="You are Qwen, created by Alibaba Cloud. You are a helpful assistant."),
    Template("qwen2", **_QWEN, default_system="You are a helpful assistant."),
    Template("qwen3", **_QWEN, reasoning=True),
    Template("qwen3_nothink", **_QWEN),
    Template("qwen2_vl", **_QWEN, default_system="You are a helpful assistant.", mm_plugin="qwen2_vl"),
    Template("qwen3_vl", **_QWEN, reasoning=True, mm_plugin="qwen3_vl"),
    Template("qwen3_vl_nothink", **_QWEN, mm_plugin="qwen3_vl"),
    Template("phi4", **_turns("<|im_start|>", "<|im_sep|>", "<|im_end|>"), stop_words=("<|im_end|>",),
             replace_eos=True),
    Template("llama2", user=(BOS, "[INST] {{content}} [/INST]"), system=("<<SYS>>\n{{content}}\n<</SYS>>\n\n",),
             fuse_system=True),
    Template("llama3", **_LLAMA3, prefix=(BOS,), stop_words=("<|eot_id|>", "<|eom_id|>"), replace_eos=True,
             tool_format="llama3", pt_eos="<|end_of_text|>"),
    Template("llama4", **_LLAMA4, prefix=(BOS,), stop_words=("<|eot|>", "<|eom|>"), replace_eos=True,
             tool_format="llama3"),
    Template("mistral", user=("[INST] {{content}}[/INST]",), assistant=(" {{content}}", EOS),
             system=("{{content}}\n\n",), function=("[TOOL_CALLS] {{content}}", EOS),
             observation=('[TOOL_RESULTS] {"content": {{content}}}[/TOOL_RESULTS]',),
             prefix=(BOS,), fuse_system=True, tool_format="mistral"),
    Template("mistral_small", user=("[INST]{{content}}[/INST]",), system=("[SYSTEM_PROMPT]{{content}}[/SYSTEM_PROMPT]",),
             function=("[TOOL_CALLS]{{content}}", EOS),
             observation=('[TOOL_RESULTS]{"content": {{content}}}[/TOOL_RESULTS]',),
             prefix=(BOS,), tool_format="mistral"),
    Template("gemma", **_GEMMA),
    Template("gemma3", **_GEMMA, mm_plugin="gemma3"),
    Template("deepseek3", **_DEEPSEEK),
    Template("deepseekr1", **_DEEPSEEK, reasoning=True),
    Template("glm4", **_GLM4, tool_format="glm4"),
    Template("glm4_moe", **_GLM4, tool_format="glm4_moe", reasoning=True),
    Template("qwen3_5", **_QWEN35, reasoning=True),
    Template("qwen3_5_nothink", **_QWEN35),
    Template("lfm2", **dict(_QWEN, tool_format="lfm2", observation=(
        "<|im_start|>tool\n<|tool_response_start|>{{content}}<|tool_response_end|><|im_end|>\n<|im_start|>assistant\n",)),
             default_system="You are a helpful AI assistant.",
             tool_call_words=("<|tool_call_start|>", "<|tool_call_end|>")),
    Template("minimax1", user=(_MINIMAX1_TURN.format(head="user name=user") + _MINIMAX1_ANSWER,),
             assistant=("{{content}}<end_of_sentence>\n",),
             system=(_MINIMAX1_TURN.format(head="system ai_setting=assistant"),),
             observation=(_MINIMAX1_TURN.format(head="tool name=tools") + _MINIMAX1_ANSWER,),
             default_system="You are a helpful assistant.", stop_words=("<end_of_sentence>",), tool_format="minimax1"),
    Template("minimax2", user=("]~b]user\n{{content}}[e~[\n]~b]ai\n",), assistant=("{{content}}[e~[\n",),
             system=("]~!b[]~b]system\n{{content}}[e~[\n",),
             observation=("]~b]tool\n<response>{{content}}</response>[e~[\n]~b]ai\n",),
             default_system="You are a helpful assistant. Your name is MiniMax-M2.1 and is built by MiniMax.",
             stop_words=("[e~[",), tool_format="minimax2", reasoning=True),
    Template("seed_oss", user=(BOS, "user\n{{content}}", EOS, BOS, "assistant\n"), system=(BOS, "system\n{{content}}", EOS),
             function=(BOS, "\n{{content}}", EOS), tool_format="seed_oss", reasoning=True,
             thought_words=("<seed:think>", "</seed:think>")),
    Template("bailing_v2", user=("<role>HUMAN</role>{{content}}<|role_end|><role>ASSISTANT</role>",),
             assistant=("{{content}}<|role_end|>",), system=("<role>SYSTEM</role>{{content}}<|role_end|>",),
             observation=("<role>OBSERVATION</role>\n<tool_response>\n{{content}}\n</tool_response><|role_end|>"
                          "<role>ASSISTANT</role>",),
             stop_words=("<|endoftext|>",), efficient_eos=True, tool_format="ling"),
    Template("gemma4", user=(_GEMMA4_TURN.format(role="user") + "<|turn>model\n",), assistant=("{{content}}<turn|>\n",),
             system=("<|turn>system\n<|think|>{{content}}<turn|>\n",),
             observation=(_GEMMA4_TURN.format(role="tool") + "<|turn>model\n",), function=("<|tool>{{content}}<tool|>",),
             prefix=(BOS,), default_system="You are a helpful assistant.", stop_words=("<turn|>",), replace_eos=True,
             reasoning=True, thought_words=("<|channel>thought\n", "<channel|>"), tool_format="gemma4"),
    Template("baichuan2", user=("<reserved_106>{{content}}<reserved_107>",), efficient_eos=True),
    Template("cohere", user=(_COHERE_TURN.format(role="USER") + "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",),
             system=(_COHERE_TURN.format(role="SYSTEM"),), prefix=(BOS,)),
    Template("granite3", **_turns("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>\n")),
    Template("llava", user=("USER: {{content}} ASSISTANT:",), mm_plugin="llava",
             default_system="A chat between a curious user and an artificial intelligence assistant. "
                            "The assistant gives helpful, detailed, and polite answers to the user's questions."),
    Template("olmo", user=("<|user|>\n{{content}}<|assistant|>\n",), prefix=(EOS,)),
)}

AUTO = ("auto", None, "")


def get_template(name: str | None, tokenizer, tool_format: str | None = None,
                 default_system: str | None = None, today: str | None = None) -> Template:
    """A named built-in template, or (None/'auto') one read from the tokenizer's own chat template.

    `tool_format` replaces the template's tool writing as LLaMA-Factory's key does; `today` is the date a tool prompt
    may write."""
    if name in AUTO:
        template = template_from_tokenizer(tokenizer) or TEMPLATES["empty"]
    elif name in TEMPLATES:
        template = TEMPLATES[name]
    else:
        raise ConfigError(f"template '{name}' is not known{did_you_mean(name, TEMPLATES)}; "
                          f"use one of {sorted(TEMPLATES)} or 'auto' for the tokenizer's own")
    changes: dict[str, Any] = {"today": tool_date(today)}
    if tool_format:
        if tool_format not in TOOL_FORMATS:
            raise ConfigError(f"tool_format '{tool_format}' is not known; use one of {sorted(TOOL_FORMATS)}")
        eos = Special(template.stop_words[0]) if template.replace_eos else EOS
        changes.update(tool_format=tool_format, function=("{{content}}",) if template.efficient_eos else ("{{content}}", eos))
    if default_system is not None:
        changes["default_system"] = default_system
    return template.replace(**changes)
