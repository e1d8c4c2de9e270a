"""A collection's lexical language (retrieval.analysis): its documents and queries analysed with
that Snowball stemmer — so a German collection finds "Häuser" for "Haus", which the English
analysis cannot — kept in every shard manifest, and carried by the write path, a compaction, a
snapshot restore and the child-process build of a large base."""

import numpy as np
import pytest

from index_shards import compaction
from index_shards.build import BuildConfig, build_collection
from index_shards.layout import resolve_version, shard_dir
from index_shards.lexical_warm import build_base_lexicon
from index_shards.manifest import ShardManifest, read_collection_manifest
from index_shards.shard import Shard
from index_shards.versions import ShardVersions
from index_shards.writes import accept
from retrieval.analysis import (
    DEFAULT_LANGUAGE,
    analyze,
    check_language,
    describe_language,
    languages,
    query_stop_words,
    query_terms,
)
from retrieval.bm25 import LexicalQuery
from retrieval.contract import SearchParams
from retrieval.errors import ConfigError
from retrieval.records import UPSERT, WalRecord
from retrieval.types import Document, EmbeddingVersion

DIM = 8
GERMAN = [  # also the integration test's (tests/integration/test_lexical_language.py)
    Document("see", "Die Häuser am See sind alt und schön", "Häuser am See"),
    Document("garten", "Ein kleiner Garten mit Blumen", "Gärten"),
    Document("stadt", "Die Stadt hat viele Straßen und Häuser", "Stadt"),
    Document("berg", "Der Berg ist hoch, die Hütte darauf klein", "Berge"),
    Document("fluss", "Der Fluss fließt durch die Stadt", "Flüsse"),
]


def replica_of(root, language: str, documents=GERMAN) -> ShardVersions:
    vectors = np.random.default_rng(0).standard_normal((len(documents), DIM)).astype(np.float32)
    build_collection(root, documents, vectors, EmbeddingVersion("lang", "0" * 64, DIM),
                     BuildConfig("c", 1, lexical_language=language), show_progress=False)
    directory, _ = resolve_version(root, "c")
    return ShardVersions(Shard.load(shard_dir(directory, 0), device="cpu"), data_dir=root / "data")


def lexical(replica: ShardVersions, text: str) -> list[str]:
    reply = replica.search(np.zeros((0, DIM)), SearchParams(5, None, lexical=True), [LexicalQuery(text)])
    return list(reply.results[0]["doc_ids"])


def test_each_language_analyses_its_own_way():
    assert analyze("Die Häuser sind groß", "german") == ["die", "haus", "sind", "gross"]
    assert analyze("Die Häuser sind groß") == ["die", "häuser", "sind", "groß"]  # English: no German stems
    assert analyze("The houses are big") == ["hous", "big"]  # English: stop words dropped, stemmed
    assert analyze("The houses", "none") == ["the", "houses"]  # none: the words as they are
    assert query_terms("Häuser Haus", "german") == [("haus", 2)]
    assert analyze("東京の天気は晴れ", "cjk") == ["東京", "京の", "の天", "天気", "気は", "は晴", "晴れ"]
    assert analyze("iPhone 15の価格", "cjk") == ["iphone", "15", "の価", "価格"] and analyze("猫", "cjk") == ["猫"]
    assert {"english", "german", "french", "cjk", "none"} <= set(languages())
    assert check_language("german") == "german"
    with pytest.raises(ConfigError) as bad:
        check_language("klingon")
    assert bad.value.field == "lexical_language"
    with pytest.raises(ConfigError):
        BuildConfig("c", 1, lexical_language="klingon").validate()


def test_a_german_collection_finds_inflected_forms_and_keeps_its_language(tmp_path):
    german = replica_of(tmp_path / "de", "german")
    english = replica_of(tmp_path / "en", DEFAULT_LANGUAGE)
    assert lexical(german, "Haus")[0] == "see" and lexical(german, "Garten")[:1] == ["garten"]
    assert lexical(english, "Haus") == []  # the English analysis keeps "häuser": no match
    version = german.ready_ids()[0]
    described = german.describe()[0]
    assert described.lexical_language == "german" and english.describe()[0].lexical_language == "english"
    directory = german.slot(version).shard.directory
    assert read_collection_manifest(directory.parent).lexical_language == "german"
    # the default is written as nothing: manifests of English collections are what they were
    english_dir = english.slot(english.ready_ids()[0]).shard.directory
    assert "lexical_language" not in (english_dir / "manifest.json").read_text()
    assert ShardManifest.from_dict(german.slot(version).shard.manifest.to_dict()).lexical_language == "german"

    # a written document is analysed in the collection's language, and so is the compacted base
    accept(german, version, 0, None, [WalRecord(1, UPSERT, "wald", "Wälder", "Im Wald stehen alte Bäume", {},
                                                np.ones(DIM, np.float32))])
    assert lexical(german, "Baum") == ["wald"]
    compaction.compact(german, version)
    base = german.slot(version).shard
    assert base.manifest.lexical_language == "german" and base.lexicon.language == "german"
    assert lexical(german, "Baum") == ["wald"] and lexical(german, "Haus")[0] == "see"
    # the child-process build (large bases) analyses in the same language
    apart = build_base_lexicon(base.docstore, language="german", apart_min_docs=1)
    assert apart.language == "german" and apart.vocabulary == base.lexicon.vocabulary
    german.close()
    english.close()


def test_a_query_in_another_language_is_not_searched_for_its_stop_words(tmp_path):
    # Snowball's lists: function words only, not the content words other packages' lists hold
    assert {"der", "die", "und", "nicht"} <= query_stop_words("german") and "haus" not in query_stop_words("german")
    assert {"les", "et", "de"} <= query_stop_words("french") and "état" not in query_stop_words("french")
    assert "время" not in query_stop_words("russian") and "и" in query_stop_words("russian")
    assert query_stop_words("dutch_porter") == query_stop_words("dutch") and "het" in query_stop_words("dutch")
    assert query_stop_words("porter") == query_stop_words(DEFAULT_LANGUAGE)
    assert not query_stop_words("basque") and not query_stop_words("cjk") and not query_stop_words("none")
    assert query_terms("Die Geschichte der Stadt und die Häuser", "german") == [
        ("geschicht", 1), ("stadt", 1), ("haus", 1)]
    assert query_terms("Le chat et les maisons", "french") == [("chat", 1), ("maison", 1)]
    assert analyze("Die Häuser", "german") == ["die", "haus"]  # documents keep them: old indexes stay exact
    # what `shardrag build --lexical-language list` says of each
    assert describe_language("german") == f"Snowball stems; {len(query_stop_words('german'))} stop words dropped " \
        "from queries"
    assert "documents and queries" in describe_language("english") and "no stop words" in describe_language("basque")
    assert all(describe_language(language) for language in languages())

    german = replica_of(tmp_path / "de", "german")
    plain = german.search(np.zeros((0, DIM)), SearchParams(5, None, lexical=True), [LexicalQuery("Häuser Stadt")])
    worded = german.search(np.zeros((0, DIM)), SearchParams(5, None, lexical=True),
                           [LexicalQuery("die Häuser und die Stadt")])
    assert lexical(german, "Häuser Stadt") == ["stadt", "see", "fluss"]
    assert list(worded.results[0]["doc_ids"]) == list(plain.results[0]["doc_ids"])
    assert list(worded.results[0]["scores"]) == list(plain.results[0]["scores"])  # "die", "und" add nothing
    assert lexical(german, "und die der") == []  # a query of stop words alone matches nothing, as in English
    german.close()


def test_a_cjk_collection_finds_words_inside_unspaced_text(tmp_path):
    documents = [Document("tokyo", "東京の天気は晴れです", "東京"), Document("osaka", "大阪の食べ物は美味しい", "大阪"),
                 Document("seoul", "서울의 날씨는 맑음", "서울")]
    cjk = replica_of(tmp_path / "cjk", "cjk", documents)
    assert lexical(cjk, "天気") == ["tokyo"] and lexical(cjk, "食べ物") == ["osaka"]
    assert lexical(cjk, "날씨") == ["seoul"]
    english = replica_of(tmp_path / "en", DEFAULT_LANGUAGE, documents)
    assert lexical(english, "天気") == []  # one token per unspaced run: no word inside it matches
    cjk.close()
    english.close()
