"""The built-in chat templates by name, and `get_template`, which picks one for a run.

The slot strings are facts about the models, as LLaMA-Factory 0.9.5 declares them; `qwen2` and `baichuan2`, which
0.9.5 no longer has, follow its earlier releases. `benchmarks/data_throughput.py --template-parity` checks parity."""

from __future__ import annotations

import dataclasses
from typing import Any

from tuneline.data.templates import BOS, EOS, Special, Template, template_from_tokenizer
from tuneline.data.tools import TOOL_FORMATS, tool_date
from tuneline.data.unbuilt_templates import unbuilt_template_problem
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

_IM_TOOL = _turns("<|im_start|>", "\n", "<|im_end|>\n", tool_role="tool")
_PHI = _turns("<|", "|>\n", "<|end|>\n")
_GLM47 = dict(_GLM4, tool_format="glm4_moe", reasoning=True, thought_words=("<think>", "</think>"),
              empty_thought="</think>")  # GLM-4.7 writes an empty thought as its closing word alone
_HUNYUAN_SMALL = ("<｜hy_User｜>", "<｜hy_place▁holder▁no▁8｜>", "<｜hy_place▁holder▁no▁2｜>", "<｜hy_place▁holder▁no▁3｜>")
_GPT_OSS_THOUGHT = ("<|channel|>analysis<|message|>", "<|end|><|start|>assistant<|channel|>final<|message|>")
_OPENCHAT36_USER = ("<|start_header_id|>GPT4 Correct User<|end_header_id|>\n\n{{content}}<|eot_id|>"
                    "<|start_header_id|>GPT4 Correct Assistant<|end_header_id|>\n\n")
_GRANITE4_TURN = "<|start_of_role|>{role}<|end_of_role|>{{{{content}}}}<|end_of_text|>\n"
_VICUNA_SYSTEM = ("A chat between a curious user and an artificial intelligence assistant. "
                  "The assistant gives helpful, detailed, and polite answers to the user's questions.")
_DBRX_SYSTEM = (
    "You are DBRX, created by Databricks. You were last updated in December 2023. "
    "You answer questions based on information available up to that point.\n"
    "YOU PROVIDE SHORT RESPONSES TO SHORT QUESTIONS OR STATEMENTS, but provide thorough "
    "responses to more complex and open-ended questions.\nYou assist with various tasks, "
    "from writing to coding (using markdown for code blocks — remember to use ``` with "
    "code, JSON, and tables).\n(You do not have real-time data access or code execution "
    "capabilities. You avoid stereotyping and provide balanced perspectives on "
    "controversial topics. You do not provide song lyrics, poems, or news articles and "
    "do not divulge details of your training data.)\nThis is your system prompt, "
    "guiding your responses. Do not reference it, just respond to the user. If you find "
    "yourself talking about this message, stop. You should be responding appropriately "
    "and usually that means not mentioning this.\nYOU DO NOT MENTION ANY OF THIS INFORMATION "
    "ABOUT YOURSELF UNLESS THE INFORMATION IS DIRECTLY PERTINENT TO THE USER'S QUERY."
)
_DEEPSEEKCODER_SYSTEM = (
    "You are an AI programming assistant, utilizing the DeepSeek Coder model, "
    "developed by DeepSeek Company, and you only answer questions related to computer science. "
    "For politically sensitive questions, security and privacy issues, "
    "and other non-computer science questions, you will refuse to answer.\n"
)
_SEED_CODER_SYSTEM = (
    "You are an AI programming assistant, utilizing the Seed-Coder model, developed by ByteDance Seed, "
    "and you only answer questions related to computer science. For politically sensitive questions, "
    "security and privacy issues, and other non-computer science questions, you will refuse to answer.\n\n"
)
_SAILOR_SYSTEM = ("You are an AI assistant named Sailor created by Sea AI Lab. "
                  "Your answer should be friendly, unbiased, faithful, informative and detailed.")
_AEVA_SYSTEM = ("You are an AI assistant named Aeva created by Zongzhi Lou. "
                "Your answer should be friendly, unbiased, faithful, informative and detailed.")
_TELECHAT2_SYSTEM = ("你是中国电信星辰语义大模型，英文名是TeleChat，你是由中电信人工智能科技有限公司和中国电信人工智能研究院"
                     "（TeleAI）研发的人工智能助手。")
_XUANYUAN_SYSTEM = ("以下是用户和人工智能助手之间的对话。用户以Human开头，人工智能助手以Assistant开头，"
                    "会对人类提出的问题给出有帮助、高质量、详细和礼貌的回答，并且总是拒绝参与与不道德、"
                    "不安全、有争议、政治敏感等相关的话题、问题和指示。\n")

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
    Template("qwen3_6", **_QWEN35, reasoning=True),
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
    Template("llava", user=("USER: {{content}} ASSISTANT:",), mm_plugin="llava", default_system=_VICUNA_SYSTEM),
    Template("llava_next", user=("USER: {{content}} ASSISTANT:",), mm_plugin="llava_next",
             default_system=_VICUNA_SYSTEM),
    Template("minicpm_v_4_6", **_IM, stop_words=("<|im_end|>",), default_system="You are a helpful assistant.",
             mm_plugin="minicpm_v_4_6"),
    Template("olmo", user=("<|user|>\n{{content}}<|assistant|>\n",), prefix=(EOS,)),
    Template("bailing", user=("<role>HUMAN</role>{{content}}<role>ASSISTANT</role>",),
             system=("<role>SYSTEM</role>{{content}}",),
             observation=("<role>OBSERVATION</role>{{content}}<role>ASSISTANT</role>",),
             stop_words=("<|endoftext|>",), efficient_eos=True),
    Template("breeze", user=("[INST] {{content}} [/INST] ",), prefix=(BOS,), efficient_eos=True),
    Template("chatglm3", user=(Special("<|user|>"), "\n", "{{content}}", Special("<|assistant|>")),
             assistant=("\n", "{{content}}"), system=(Special("<|system|>"), "\n", "{{content}}"),
             function=("{{content}}",),
             observation=(Special("<|observation|>"), "\n", "{{content}}", Special("<|assistant|>")),
             prefix=(Special("[gMASK]"), Special("sop")), stop_words=("<|user|>", "<|observation|>"),
             efficient_eos=True, tool_format="glm4"),
    Template("chatml_de", **_IM_TOOL, default_system="Du bist ein freundlicher und hilfsbereiter KI-Assistent.",
             stop_words=("<|im_end|>", "<|im_start|>"), replace_eos=True),
    Template("cpm4", **_IM_TOOL, prefix=(BOS,), stop_words=("<|im_end|>",)),
    Template("dbrx", **_IM_TOOL, default_system=_DBRX_SYSTEM, stop_words=("<|im_end|>",), replace_eos=True),
    Template("deepseek", user=("User: {{content}}\n\nAssistant:",), system=("{{content}}\n\n",), prefix=(BOS,)),
    Template("deepseekcoder", user=("### Instruction:\n{{content}}\n### Response:",),
             assistant=("\n{{content}}\n<|EOT|>\n",), prefix=(BOS,), default_system=_DEEPSEEKCODER_SYSTEM),
    Template("hy3", user=("<｜hy_User｜>{{content}}<｜hy_Assistant｜>",), assistant=("{{content}}<｜hy_eos｜>",),
             system=("{{content}}",), prefix=(BOS,), stop_words=("<｜hy_eos｜>",), replace_eos=True, reasoning=True,
             thought_words=("<think>", "</think>")),
    Template("ernie", **_turns("<|im_start|>", "\n", "<|im_end|>\n\n", tool_role="tool"),
             default_system="<global_setting>\nthink_mode=True\n</global_setting>", stop_words=("<|im_end|>",)),
    Template("ernie_nothink", user=("User: {{content}}\nAssistant: ",), assistant=("{{content}}<|end_of_sentence|>",),
             system=("{{content}}\n",), prefix=("<|begin_of_sentence|>",), stop_words=("<|end_of_sentence|>",)),
    Template("exaone", user=("[|user|]{{content}}\n[|assistant|]",), assistant=("{{content}}", EOS, "\n"),
             system=("[|system|]{{content}}[|endofturn|]\n",)),
    Template("falcon", user=("User: {{content}}\nFalcon:",), assistant=("{{content}}\n",), efficient_eos=True),
    Template("falcon_h1", **_IM_TOOL, prefix=(BOS,), stop_words=("<|im_end|>", "<|end_of_text|>")),
    Template("fewshot", assistant=("{{content}}\n\n",), efficient_eos=True),
    Template("gemma2", **dict(_GEMMA, replace_eos=False, stop_words=("<eos>", "<end_of_turn>"), efficient_eos=True)),
    Template("glm4_7", **_GLM47),
    Template("aeva", **_GLM47, default_system=_AEVA_SYSTEM),
    Template("glmz1", **_GLM4, tool_format="glm4", reasoning=True),
    Template("gpt_oss", user=("<|start|>user<|message|>{{content}}<|end|><|start|>assistant",),
             assistant=("{{content}}",), system=("<|start|>system<|message|>{{content}}<|end|>",),
             default_system="You are ChatGPT, a large language model trained by OpenAI.", efficient_eos=True,
             reasoning=True, thought_words=_GPT_OSS_THOUGHT),
    Template("granite4", user=(_GRANITE4_TURN.format(role="user") + "<|start_of_role|>assistant<|end_of_role|>",),
             assistant=("{{content}}<|end_of_text|>\n",), system=(_GRANITE4_TURN.format(role="system"),),
             observation=(_GRANITE4_TURN.format(role="tool") + "<|start_of_role|>assistant\n",),
             default_system="You are Granite, developed by IBM. You are a helpful AI assistant.",
             stop_words=("<|end_of_text|>",)),
    Template("index", user=("reserved_0{{content}}reserved_1",), system=("<unk>{{content}}",), efficient_eos=True),
    Template("hunyuan", user=("{{content}}<|extra_0|>",), assistant=("{{content}}<|eos|>",),
             system=("{{content}}<|extra_4|>",), prefix=("<|startoftext|>",), stop_words=("<|eos|>",)),
    Template("hunyuan_small", user=("{{content}}".join(_HUNYUAN_SMALL[:2]),), assistant=("{{content}}" + _HUNYUAN_SMALL[2],),
             system=("{{content}}" + _HUNYUAN_SMALL[3],), prefix=("<｜hy_begin▁of▁sentence｜>",),
             stop_words=(_HUNYUAN_SMALL[2],)),
    Template("llama2_zh", user=(BOS, "[INST] {{content}} [/INST]"), system=("<<SYS>>\n{{content}}\n<</SYS>>\n\n",),
             default_system="You are a helpful assistant. 你是一个乐于助人的助手。", fuse_system=True),
    Template("moonlight", user=("<|im_user|>user<|im_middle|>{{content}}<|im_end|><|im_assistant|>assistant<|im_middle|>",),
             assistant=("{{content}}<|im_end|>",), system=("<|im_system|>system<|im_middle|>{{content}}<|im_end|>",),
             default_system="You are a helpful assistant provided by Moonshot-AI.", stop_words=("<|im_end|>",),
             replace_eos=True),
    Template("mimo", **_QWEN, default_system="You are a helpful assistant.", reasoning=True),
    Template("mimo_v2", **_QWEN, default_system="You are MiMo, a helpful AI assistant engineered by Xiaomi.",
             reasoning=True, thought_words=("<think>", "</think>")),
    Template("ministral", user=("[INST]{{content}}[/INST]",), system=("{{content}}\n\n",),
             function=("[TOOL_CALLS]{{content}}", EOS),
             observation=('[TOOL_RESULTS]{"content": {{content}}}[/TOOL_RESULTS]',), prefix=(BOS,), fuse_system=True,
             tool_format="mistral"),
    Template("openchat", user=("GPT4 Correct User: {{content}}", EOS, "GPT4 Correct Assistant:"), prefix=(BOS,)),
    Template("openchat-3.6", user=(_OPENCHAT36_USER,), prefix=(BOS,), stop_words=("<|eot_id|>",)),
    Template("opencoder", **_IM_TOOL, default_system="You are OpenCoder, created by OpenCoder Team.",
             stop_words=("<|im_end|>",)),
    Template("phi", **_PHI, stop_words=("<|end|>",), replace_eos=True),
    Template("phi_small", **_PHI, stop_words=("<|end|>",), replace_eos=True),  # its prefix slot writes nothing
    Template("phi4_mini", **_turns("<|", "|>", "<|end|>"), tools_slot="<|tool|>{{content}}<|/tool|>",
             stop_words=("<|end|>",), replace_eos=True),
    Template("sailor", user=("<|im_start|>question\n{{content}}<|im_end|>\n<|im_start|>answer\n",),
             assistant=("{{content}}<|im_end|>\n",), system=("<|im_start|>system\n{{content}}<|im_end|>\n",),
             default_system=_SAILOR_SYSTEM, stop_words=("<|im_end|>",)),
    Template("seed_coder", user=(BOS, "user\n{{content}}", EOS, BOS, "assistant\n"),
             system=(BOS, "system\n{{content}}", EOS), default_system=_SEED_CODER_SYSTEM),
    Template("smollm", **_IM, stop_words=("<|im_end|>",)),
    Template("smollm2", **_IM, stop_words=("<|im_end|>",),
             default_system="You are a helpful AI assistant named SmolLM, trained by Hugging Face."),
    Template("solar", user=("### User:\n{{content}}\n\n### Assistant:\n",), system=("### System:\n{{content}}\n\n",),
             efficient_eos=True),
    Template("starchat", user=("<|user|>\n{{content}}<|end|>\n<|assistant|>",), assistant=("{{content}}<|end|>\n",),
             system=("<|system|>\n{{content}}<|end|>\n",), stop_words=("<|end|>",)),
    Template("telechat2", user=("<_user>{{content}}<_bot>",), system=("<_system>{{content}}",),
             default_system=_TELECHAT2_SYSTEM),
    Template("vicuna", user=("USER: {{content}} ASSISTANT:",), default_system=_VICUNA_SYSTEM),
    Template("xuanyuan", user=("Human: {{content}} Assistant:",), default_system=_XUANYUAN_SYSTEM),
    Template("youtu", user=("<|User|>{{content}}<|Assistant|>",), assistant=("{{content}}<|end_of_text|>",),
             system=("{{content}}",), function=("{{content}}",),
             observation=("<tool_response>\n{{content}}\n</tool_response><|Assistant|>",), prefix=(BOS,),
             stop_words=("<|end_of_text|>",), replace_eos=True, reasoning=True),
    Template("yuan", user=("{{content}}", Special("<sep>")), assistant=("{{content}}<eod>\n",), stop_words=("<eod>",)),
    Template("zephyr", user=("<|user|>\n{{content}}", EOS, "<|assistant|>\n"), system=("<|system|>\n{{content}}", EOS),
             default_system="You are Zephyr, a helpful assistant."),
)}

# LLaVA-NeXT on other language models: each of LLaMA-Factory's templates is that model's own text turns (Qwen's with a
# plainer default system prompt) around the any-resolution image plugin
LLAVA_NEXT_TEXT = {"llava_next_llama3": "llama3", "llava_next_mistral": "mistral", "llava_next_qwen": "qwen",
                   "llava_next_yi": "yi"}
TEMPLATES.update({name: dataclasses.replace(TEMPLATES[text], name=name, mm_plugin="llava_next") for name, text in
                  LLAVA_NEXT_TEXT.items()})
TEMPLATES["llava_next_qwen"] = dataclasses.replace(TEMPLATES["llava_next_qwen"],
                                                   default_system="You are a helpful assistant.")
# Pixtral: Ministral's text turns around Pixtral's rows of image patches
TEMPLATES["pixtral"] = dataclasses.replace(TEMPLATES["ministral"], name="pixtral", mm_plugin="pixtral")
# PaliGemma: the images go before everything (the plugin places them), then the prompt on its own line, or Gemma's turns
TEMPLATES["paligemma"] = Template("paligemma", user=("{{content}}\n",), prefix=(BOS,), fuse_system=True,
                                  mm_plugin="paligemma")
TEMPLATES["paligemma_chat"] = Template("paligemma_chat", **dict(_GEMMA, system=None), mm_plugin="paligemma")
# Llama 3.2 Vision: Llama 3's turns; each image one <|image|> token, read through cross-attention
TEMPLATES["mllama"] = dataclasses.replace(TEMPLATES["llama3"], name="mllama", mm_plugin="mllama")

# InternVL and Intern-S1: InternLM's ChatML turns (after the bos token) around the tiling image plugin
_INTERNVL_SYSTEM = ("你是书生·万象，英文名是InternVL，是由上海人工智能实验室、清华大学及"
                    "多家合作单位联合开发的多模态大语言模型。")
TEMPLATES["intern_vl"] = TEMPLATES["intern2"].replace(name="intern_vl", mm_plugin="intern_vl",
                                                      default_system=_INTERNVL_SYSTEM)
TEMPLATES["intern_s1"] = TEMPLATES["intern_vl"].replace(name="intern_s1", default_system="")
# GLM-4.1V and GLM-4.5V: GLM-Z1's and GLM-4.5's reasoning turns, "</answer>" stopping too, around the GLM-4.1V plugin
TEMPLATES.update({name: TEMPLATES[text].replace(name=name, mm_plugin="glm4v",
                                                stop_words=(*TEMPLATES[text].stop_words, "</answer>"))
                  for name, text in (("glm4v", "glmz1"), ("glm4_5v", "glm4_moe"))})

AUTO = ("auto", None, "")
VISION = sorted(name for name, template in TEMPLATES.items() if template.mm_plugin)


def get_template(name: str | None, tokenizer, tool_format: str | None = None,
                 default_system: str | None = None, today: str | None = None, enable_thinking: bool | None = True,
                 preserve_thinking: bool = False) -> Template:
    """A named built-in template, or (None/'auto') one read from the tokenizer's own chat template.

    `tool_format` replaces the template's tool writing as LLaMA-Factory's key does; `today` is the date a tool prompt
    may write; the thinking switches matter to reasoning templates only."""
    if name in AUTO:
        template = template_from_tokenizer(tokenizer) or TEMPLATES["empty"]
    elif name in TEMPLATES:
        template = TEMPLATES[name]
    else:
        raise ConfigError(unbuilt_template_problem(name, VISION) or f"template '{name}' is not known"
                          f"{did_you_mean(name, TEMPLATES)}; use one of {sorted(TEMPLATES)} or 'auto' for the "
                          "tokenizer's own")
    changes: dict[str, Any] = {"today": tool_date(today), "enable_thinking": enable_thinking,
                               "preserve_thinking": preserve_thinking}
    if tool_format:
        if tool_format not in TOOL_FORMATS:
            raise ConfigError(f"tool_format '{tool_format}' is not known; use one of {sorted(TOOL_FORMATS)}")
        eos = Special(template.stop_words[0]) if template.replace_eos else EOS
        changes.update(tool_format=tool_format, tools_slot=None,
                       function=("{{content}}",) if template.efficient_eos else ("{{content}}", eos))
    if default_system is not None:
        changes["default_system"] = default_system
    return template.replace(**changes)


def run_template(data, tokenizer) -> Template:
    """The template a run's data keys (`DataArgs`) ask for."""
    return get_template(data.template, tokenizer, data.tool_format, data.default_system, data.tool_date,
                        data.enable_thinking, data.preserve_thinking)
