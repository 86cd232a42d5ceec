"""Ready-to-paste code for a key: curl, the OpenAI SDKs for Python and JavaScript, LangChain.

The snippets carry the key's visible prefix only, never its secret: each reads the whole key
from ``OPENAI_API_KEY``, so the same code works pasted into a shell, a notebook or a service.
"""

from __future__ import annotations

from dataclasses import dataclass

from governance.models import ApiKey


@dataclass(frozen=True)
class Quickstart:
    base_url: str
    model: str  # the model the snippets call: the first the use case may call
    models: tuple[str, ...]  # every model it may call
    key_hint: str
    curl: str
    python: str
    javascript: str
    langchain: str

    @property
    def snippets(self) -> list[tuple[str, str, str]]:
        """(title, element id, code) of each snippet, in the order the page shows them."""
        return [
            ("curl", "snippet-curl", self.curl),
            ("Python (OpenAI SDK)", "snippet-python", self.python),
            ("JavaScript (OpenAI SDK)", "snippet-javascript", self.javascript),
            ("LangChain (langchain-openai)", "snippet-langchain", self.langchain),
        ]


def quickstart(key: ApiKey, gateway_url: str) -> Quickstart:
    base_url = gateway_url.rstrip("/") + "/v1"
    models = tuple(sorted(m.public_id for m in key.use_case.allowed_models.all()))
    model = models[0] if models else "MODEL"
    hint = f"{key.prefix or 'sk-sy-'}…"
    others = (
        f"  (or {', '.join(models[1:])})" if len(models) > 1 else ""
    )  # the other models, as a comment: one snippet, every choice in view
    curl = (
        f'export OPENAI_API_KEY="{hint}"   # paste your whole key here\n'
        f"curl {base_url}/chat/completions \\\n"
        '  -H "Authorization: Bearer $OPENAI_API_KEY" \\\n'
        '  -H "Content-Type: application/json" \\\n'
        f'  -d \'{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello"}}]}}\''
    )
    python = (
        "import os\n"
        "from openai import OpenAI\n\n"
        f'# export OPENAI_API_KEY="{hint}"  (your whole key)\n'
        "client = OpenAI(\n"
        f'    base_url="{base_url}",\n'
        '    api_key=os.environ["OPENAI_API_KEY"],\n'
        ")\n"
        "reply = client.chat.completions.create(\n"
        f'    model="{model}",{"  #" + others if others else ""}\n'
        '    messages=[{"role": "user", "content": "Hello"}],\n'
        ")\n"
        "print(reply.choices[0].message.content)"
    )
    javascript = (
        'import OpenAI from "openai";\n\n'
        f'// export OPENAI_API_KEY="{hint}"  (your whole key)\n'
        "const client = new OpenAI({\n"
        f'  baseURL: "{base_url}",\n'
        "  apiKey: process.env.OPENAI_API_KEY,\n"
        "});\n"
        "const reply = await client.chat.completions.create({\n"
        f'  model: "{model}",{"  //" + others if others else ""}\n'
        '  messages: [{ role: "user", content: "Hello" }],\n'
        "});\n"
        "console.log(reply.choices[0].message.content);"
    )
    langchain = (
        "import os\n"
        "from langchain_openai import ChatOpenAI\n\n"
        f'# export OPENAI_API_KEY="{hint}"  (your whole key)\n'
        "llm = ChatOpenAI(\n"
        f'    base_url="{base_url}",\n'
        '    api_key=os.environ["OPENAI_API_KEY"],\n'
        f'    model="{model}",{"  #" + others if others else ""}\n'
        ")\n"
        'print(llm.invoke("Hello").content)'
    )
    return Quickstart(
        base_url=base_url,
        model=model,
        models=models,
        key_hint=hint,
        curl=curl,
        python=python,
        javascript=javascript,
        langchain=langchain,
    )
