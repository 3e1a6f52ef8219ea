"""What two questions must share before one's answer may serve the other: the facts a
similarity score misses (issue 33). Pure functions, no model, microseconds per question.

A sentence encoder scores "how do I hash with encodeSHA256" and "... with encodeMD5", or
"loop 5 times" and "loop 10 times", or "convert a list to JSON" and "convert JSON to a
list", as near-identical; their answers differ. So beside the embedding's cosine the
cache compares, for the earlier question `a` and the new one `b`:

* `lang`        the question's language (English / Spanish by their function words and
                Spanish punctuation and accents; "und" when neither shows): the answer is
                written in it;
* `commands`    the AVAP commands named (the 27 of the spec; `if`, `else`, `end`, `try`,
                `exception` and `replace` only when written as code: `if(`, in backticks,
                or next to "command" / "block" / "comando" ...);
* `identifiers` what looks like code: backticked or quoted text, camelCase, snake_case,
                dotted names, words with digits (`sha256`, `user2`);
* `numbers`     digits and number words (EN / ES, "ten" = "10");
* `urls`        links and host/path names;
* `negated`     a negation (not, never, without, n't / no, nunca, sin, ni ...);
* `terms`       every other content word, accents folded, lightly stemmed and mapped to a
                small table of synonyms (declare / define / create; lista / array ...),
                question framing left out (how, what, please, explain, cómo, qué ...);
* `directions`  the term after a direction word (to / into / from; a / hacia / desde):
                "list to JSON" and "JSON to list" have the same terms and differ here.

All must agree exactly (`disagreement`): precision first. A paraphrase that words its
request with other content words than the synonym table knows is a miss, which costs
one generation; a near-duplicate taken for a paraphrase costs a wrong answer.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

import msgspec

# The AVAP commands (spec v1.0.0; tests/unit/test_cache_facts.py checks this list
# against the parser's table and the command reference).
AVAP_COMMANDS: tuple[str, ...] = (
    "addVar", "addResult", "addParam", "if", "else", "end", "startLoop", "endLoop", "try",
    "exception", "RequestGet", "RequestPost", "randomString", "encodeSHA256", "encodeMD5",
    "replace", "getRegex", "ormDirect", "getDateTime", "getTimeStamp", "stampToDatetime",
    "getQueryParamList", "getListLen", "itemFromList", "variableToList",
    "AddvariableToJSON", "variableFromJSON",
)
# Commands that are also everyday words: a command only when written as code.
_WORDLIKE = frozenset({"if", "else", "end", "try", "exception", "replace"})
_COMMANDS = {name.lower(): name for name in AVAP_COMMANDS}

_EN_WORDS = frozenset(
    "the a an is are was were be been do does did how what which who whom whose why when "
    "where can could would should will shall may might must i me my we our you your it its "
    "this that these those there of in on at for with by about from to into and or not "
    "please want need know tell explain show give have has get use using".split())
_ES_WORDS = frozenset(
    "el la los las un una unos unas es son fue ser estar está esta este esto eso ese "
    "cómo como qué que cuál cual cuáles quién dónde donde cuándo cuando por para de del "
    "al en con sin y o u no mi mis tu tus su sus se me te lo le les nos puedo puede "
    "pueden hay hago hacer quiero necesito saber dime explica explícame muéstrame favor "
    "sirve funciona usar uso".split())
_ES_MARKS = re.compile(r"[¿¡ñáéíóúü]", re.IGNORECASE)

# Question framing and grammar: words that do not change what is asked.
_STOP = frozenset(
    # English
    "a an the of in on at for with by about as is are was were be been being am do does "
    "did done doing can could would should will shall may might must i me my mine we us "
    "our you your it its this that these those there here what how which whats hows "
    "please pls thanks thank hi hello hey tell explain describe show give want wanna need "
    "like know help way ways possible any some someone something anything just actually "
    "really exactly quick quickly briefly simply simple basically kindly so then also "
    "and or but if use uses used using usage work works working make makes made write "
    "writing written go going able let lets im ive have has had get gets got "
    "thing things stuff avap language code snippet example examples sample command "
    "commands inside within between vs versus send sends sending obtain obtains retrieve "
    "retrieves fetch fetches "
    # Spanish (accents folded)
    "el la los las lo un una unos unas uno es son ser soy era fue esta estan estar esto "
    "eso este ese esa estos esas como que cual cuales quien por para de del al en con y "
    "e o u mi mis tu tus su sus se me te le les nos puedo puedes puede podemos pueden "
    "podria hay hago haces hace hacer hacerlo quiero quieres queria necesito necesitas "
    "saber sabes dime decir explica explicame explicar explicas describe describir "
    "muestra muestrame mostrarme ensename favor gracias hola oye forma formas manera "
    "maneras modo algun alguna alguno algo sirve sirven servir funciona funcionan "
    "funcionar usar uso usa usas usando utilizar utiliza escribir escribo codigo lenguaje "
    "ejemplo ejemplos muestra tengo tiene tienes ya pues entonces tambien solo bien "
    "simplemente si exactamente dentro entre posible comando comandos haga hagas hagan "
    "hecho enviar envio envia envie mandar obtener obtengo obtiene obtenga conseguir "
    "consigo consigue consiga recuperar sacar".split())

# Imperative openers of a request for code: the first word says "produce this", not what.
_OPENERS = frozenset(
    "write create generate build make give show produce implement code escribe escribir "
    "crea crear genera generar construye construir dame muestra muestrame haz hazme "
    "implementa codigo".split())
# Words before an opener that leave it one ("please write ...").
_POLITE = frozenset("please pls kindly just now also then por favor ahora tambien".split())
# Words that move something somewhere: only after one do "to" / "from" say which way.
# (Stems: copy / copied / copiar, move / mover, pass / pasar, map.)
_TRANSFERS = frozenset({"=convert", "=declare", "=append", "=assign", "=save", "copy",
                        "copi", "mov", "pass", "pas", "map"})

# Negation markers (accents folded, lower case).
_NEGATIONS = frozenset(
    "not no never without cannot cant can't dont don't doesnt doesn't isnt isn't arent "
    "aren't wont won't shouldnt shouldn't didnt didn't neither nor none nunca sin jamas "
    "ni tampoco ningun ninguna ninguno nada".split())

_NUMBER_WORDS = {
    w: str(i) for i, w in enumerate(
        "zero _ two three four five six seven eight nine ten eleven twelve thirteen "
        "fourteen fifteen sixteen seventeen eighteen nineteen twenty".split()) if w != "_"}
_NUMBER_WORDS.update({"thirty": "30", "forty": "40", "fifty": "50", "sixty": "60",
                      "hundred": "100", "thousand": "1000", "million": "1000000"})
_NUMBER_WORDS.update({
    w: str(i) for i, w in enumerate(
        "cero _ dos tres cuatro cinco seis siete ocho nueve diez once doce trece catorce "
        "quince dieciseis diecisiete dieciocho diecinueve veinte".split()) if w != "_"})
_NUMBER_WORDS.update({"treinta": "30", "cuarenta": "40", "cincuenta": "50",
                      "sesenta": "60", "cien": "100", "ciento": "100", "mil": "1000",
                      "millon": "1000000"})

# Synonyms: word (accents folded, lower case) -> its group's name. Only words whose
# swap keeps the request the same; a group is never a word's other meaning.
_SYNONYM_GROUPS: dict[str, str] = {
    "declare": "declare define create initialize initialise declaration definition "
               "generate build construct declarar definir crear inicializar declaracion "
               "definicion generar construir declaro declara declare declaras creo crea "
               "cree creas defino define genero genera genere construyo construye "
               "construya",
    "assign": "assign set asignar establecer",
    "display": "display print mostrar imprimir",
    "loop": "loop loops iterate iterating iteration looping bucle bucles ciclo ciclos "
            "iterar recorrer",
    "list": "list lists array arrays lista listas arreglo arreglos",
    "convert": "convert transform turn conversion convertir transformar conversion "
               "convierto convierte convierta transformo transforma transforme",
    "parameter": "parameter parameters param params argument arguments arg args "
                 "parametro parametros argumento argumentos",
    "string": "string strings text texts cadena cadenas texto textos",
    "integer": "integer integers int ints number numbers numeric entero enteros numero "
               "numeros",
    "length": "length size len longitud tamano largo",
    "take": "take takes accept accepts receive receives recibir recibe reciben aceptar "
            "acepta aceptan tomar toma toman",
    "type": "type types typed typing tipo tipos tipado tipar tipan tipa",
    "item": "item items element elements elemento elementos",
    "error": "error errors exception exceptions fallo fallos excepcion excepciones",
    "handle": "handle handling catch catching manage manejar capturar gestionar",
    "remove": "remove delete erase eliminar borrar quitar elimino elimina elimine borro "
              "borra borre quito quita quite",
    "append": "append add insert push anadir agregar insertar anado anada anade agrego "
              "agrega agregue inserto inserta inserte",
    "check": "check verify validate validation comprobar verificar validar validacion "
             "compruebo comprueba compruebe verifico verifica verifique valido valida "
             "valide",
    "request": "request requests peticion peticiones solicitud solicitudes",
    "database": "database databases db bd",
    "regex": "regex regexp regexes",
    "hash": "hash hashes hashing digest",
    "timestamp": "timestamp timestamps epoch",
    "call": "call calls invoke llamar invocar llamada llamadas",
    "return": "return returns devolver devuelve devuelva devuelvo retornar retorna "
              "retorne retorno",
    "difference": "difference differences differ different diferencia diferencias "
                  "diferenciar diferencian distinto distinta",
    "why": "why porque",
    "endpoint": "endpoint endpoints api apis",
    "url": "url urls link links enlace enlaces",
    "variable": "variable variables var vars",
    "response": "response respuesta",
    "result": "result results output resultado resultados salida",
    "random": "random aleatorio aleatoria aleatorios",
    "current": "current now today actual hoy",
    "date": "date dates fecha fechas",
    "time": "time hora",
    "key": "key keys clave claves",
    "value": "value values valor valores",
    "field": "field fields campo campos",
    "object": "object objects objeto objetos",
    "query": "query querystring consulta",
    "header": "header headers cabecera cabeceras encabezado encabezados",
    "body": "body cuerpo",
    "condition": "condition conditions conditional condicion condiciones condicional",
    "compare": "compare comparison comparar comparacion",
    "empty": "empty vacio vacia",
    "first": "first primer primero primera",
    "last": "last ultimo ultima",
    "read": "read reading access accessing leer leo lee lea leas acceder accedo accede "
            "acceda",
    "save": "save store guardar almacenar",
    "pattern": "pattern patterns patron patrones",
    "format": "format formats formato formatos",
    "zone": "timezone zone zona",
    "user": "user users usuario usuarios",
    "email": "email emails mail correo correos",
    "password": "password passwords contrasena contrasenas clave_acceso",
    "token": "token tokens",
    "id": "id ids identificador identificadores",
    "count": "count counting counter contar contador conteo cuento cuente",
    "start": "start begin empezar comenzar iniciar inicio",
    "stop": "stop break exit parar salir detener",
    "nested": "nested anidado anidados anidada anidadas",
    "step": "step steps paso pasos",
    "syntax": "syntax sintaxis",
    "meaning": "meaning mean means significa significado",
    "order": "order orden",
    "expect": "expect expects esperar espera espero espere",
    "wrong": "wrong incorrect incorrecto incorrecta mal",
    "fail": "fail fails failing failed falla fallar",
}
_SYNONYMS = {w: group for group, words in _SYNONYM_GROUPS.items() for w in words.split()}
# Phrases read as one term, before the words are split.
_PHRASES = (
    (re.compile(r"\bregular expressions?\b", re.I), " regex "),
    (re.compile(r"\bexpresi[oó]n(?:es)? regulares?\b", re.I), " regex "),
    (re.compile(r"\bbase(?:s)? de datos\b", re.I), " database "),
    (re.compile(r"\bpor qu[eé]\b", re.I), " why "),
    (re.compile(r"\bquery ?strings?\b", re.I), " querystring "),
    (re.compile(r"\btime ?zones?\b", re.I), " timezone "),
    (re.compile(r"\bzonas? horarias?\b", re.I), " timezone "),
    (re.compile(r"\bfor loops?\b", re.I), " loop "),
    (re.compile(r"\ba partir de\b", re.I), " desde "),
    (re.compile(r"\bhow to\b", re.I), " how "),
    (re.compile(r"\b(?:in order|want|wants|need|needs|able|trying|going|have|has|like|way|"
                r"ways|possible|is there a way) to\b", re.I), " "),
)

# A word's direction: the term after it is where something goes or comes from.
_DIRECTIONS = {"to": ">", "into": ">", "onto": ">", "a": ">", "hacia": ">",
               "from": "<", "desde": "<"}

_URL = re.compile(r"\bhttps?://[^\s`'\"<>]+|\b[\w-]+(?:\.[\w-]+)+/[^\s`'\"<>]*", re.I)
# Literal text with symbols (a format string, a zone name, a pattern): kept as written.
_SYMBOLIC = re.compile(r"[^\s`'\"]*[%$#@{}\[\]<>=|\\^~*+/][^\s`'\"]*")
_QUOTED = re.compile(r"`([^`]{1,80})`|\"([^\"]{1,80})\"|(?<!\w)'([^'\s][^']{0,78}[^'\s])'(?!\w)")
_WORD = re.compile(r"[^\W_](?:[\w.'-]*\w)?|\d+(?:[.,]\d+)?", re.UNICODE)
_NUMBER = re.compile(r"^\d+(?:[.,]\d+)?$")
# HTTP methods written in capitals name a request kind ("a GET request").
_HTTP_METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"})
_CAMEL = re.compile(r"[a-z][A-Z]|[A-Z]{2,}[a-z]")
_CODE_FORM = re.compile(
    r"`(if|else|end|try|exception|replace)`|\b(if|else|end|try|exception|replace)\s*\(|"
    r"\b(if|else|end|try|exception|replace)\s+(?:command|commands|block|blocks|statement|"
    r"statements|clause)\b|\b(?:comando|bloque|sentencia|instrucci[oó]n)\s+"
    r"(if|else|end|try|exception|replace)\b", re.IGNORECASE)


class Facts(msgspec.Struct, frozen=True):
    """What a question asks beyond its meaning (module doc)."""

    lang: str
    commands: frozenset[str]
    identifiers: frozenset[str]
    numbers: frozenset[str]
    urls: frozenset[str]
    negated: bool
    terms: frozenset[str]
    directions: frozenset[str]


def fold(text: str) -> str:
    """Lower case, accents removed (ñ too: "tamaño" -> "tamano")."""
    decomposed = unicodedata.normalize("NFKD", text.lower())
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def language(text: str) -> str:
    """"en", "es", or "und": which language's function words (and, for Spanish, its
    accents and inverted marks) the text uses more."""
    words = re.findall(r"[^\W\d_]+", text.lower())
    en = sum(w in _EN_WORDS for w in words)
    es = sum(w in _ES_WORDS for w in words) + 2 * len(_ES_MARKS.findall(text))
    # Words both languages have ("no", "a" is English too) count for neither.
    if en > es:
        return "en"
    if es > en:
        return "es"
    return "und"


def _stem(word: str, lang: str) -> str:
    if lang == "es":
        for suffix in ("aciones", "acion", "iendo", "ando", "amos", "emos", "imos", "ar",
                       "er", "ir", "as", "es", "os", "a", "o", "e", "s"):
            if word.endswith(suffix) and len(word) - len(suffix) >= 4:
                return word[: -len(suffix)]
        return word
    if len(word) > 4 and word.endswith("ies"):
        word = word[:-3] + "y"
    elif len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]
    for suffix in ("ing", "ed"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            word = word[: -len(suffix)]
            break
    if len(word) > 3 and word.endswith("e"):
        word = word[:-1]
    return word


# The same table keyed by each word's stem in either language ("declaro" finds
# "declarar"'s group); a stem two groups share is left out.
_STEMMED: dict[str, dict[str, str]] = {"en": {}, "es": {}}
for _lang, _table in _STEMMED.items():
    _clash: set[str] = set()
    for _word, _group in _SYNONYMS.items():
        _key = _stem(_word, _lang)
        if _table.setdefault(_key, _group) != _group:
            _clash.add(_key)
    for _key in _clash:
        del _table[_key]


def _term(word: str, lang: str) -> str:
    stem = _stem(word, lang)
    group = _SYNONYMS.get(word) or _STEMMED["es" if lang == "es" else "en"].get(stem)
    return f"={group}" if group is not None else stem


def _is_identifier(raw: str) -> bool:
    if "_" in raw.strip("_") or _CAMEL.search(raw) or raw in _HTTP_METHODS:
        return True
    if "." in raw and not raw.endswith(".") and not _NUMBER.match(raw):
        return True
    has_digit = any(ch.isdigit() for ch in raw)
    return has_digit and any(ch.isalpha() for ch in raw)


def _literals(text: str) -> tuple[frozenset[str], set[str], set[str], str]:
    """URLs, identifiers and commands written as literals (quoted, backticked, code
    forms, symbols), and the text left for the word reader."""
    urls = frozenset(u.rstrip(".,;:!?)").lower() for u in _URL.findall(text))
    rest = _URL.sub(" ", text)
    identifiers: set[str] = set()
    commands: set[str] = set()
    for groups in _QUOTED.findall(rest):
        quoted = next(g for g in groups if g).strip()
        name = _COMMANDS.get(quoted.lower().rstrip("()"))
        if name is not None:
            commands.add(name)
        else:
            identifiers.add(quoted.lower())
    rest = _QUOTED.sub(" ", rest)
    commands.update(_COMMANDS[next(g for g in m if g).lower()] for m in _CODE_FORM.findall(rest))
    for pattern, replacement in _PHRASES:
        rest = pattern.sub(replacement, rest)
    identifiers.update(m.strip(".,;:!?()¿¡") for m in _SYMBOLIC.findall(rest))
    return urls, identifiers, commands, _SYMBOLIC.sub(" ", rest)


class _Reader:
    """Sorts a question's words into facts, left to right."""

    def __init__(self, lang: str, identifiers: set[str], commands: set[str]) -> None:
        self.lang = lang
        self.identifiers, self.commands = identifiers, commands
        self.numbers: set[str] = set()
        self.terms: set[str] = set()
        self.directions: set[str] = set()
        self.negated = False
        self.opening = True  # only polite words yet: an imperative opener is framing
        self.transfer = False  # a word that moves something came: "to" / "from" say where
        self.pending = ""  # a direction word waiting for what it points at

    def _found(self, kind: set[str], value: str) -> None:
        kind.add(value)
        if self.pending:
            self.directions.add(self.pending + value)
            self.pending = ""

    def read(self, raw: str) -> None:
        raw = raw.strip(".'-")
        if "'" in raw and not raw.lower().endswith("n't"):
            raw = raw.split("'")[0]  # what's, I'd, addVar's: the word itself
        if not raw:
            return
        low, word = raw.lower(), fold(raw)
        if self.opening and word in _OPENERS:
            self.opening = False
            return
        self.opening = self.opening and word in _POLITE
        name = _COMMANDS.get(low)
        if name is not None and low not in _WORDLIKE:
            self._found(self.commands, name)
        elif _NUMBER.match(raw):
            self._found(self.numbers, raw.replace(",", "."))
        elif word in _NUMBER_WORDS:
            self._found(self.numbers, _NUMBER_WORDS[word])
        elif _is_identifier(raw):
            self._found(self.identifiers, low)
        elif word in _NEGATIONS or word.endswith("n't"):
            self.negated = True
        elif word in _DIRECTIONS and (word != "a" or self.lang == "es"):
            self.pending = _DIRECTIONS[word] if self.transfer else ""
        elif word not in _STOP and len(word) >= 2:
            term = _term(word, self.lang)
            self._found(self.terms, term)
            self.transfer = self.transfer or term in _TRANSFERS


@lru_cache(maxsize=4096)
def facts(text: str) -> Facts:
    """The facts of one question (cached: the same text costs a dict lookup)."""
    lang = language(text)
    urls, identifiers, commands, rest = _literals(text)
    reader = _Reader(lang, identifiers, commands)
    for raw in _WORD.findall(rest):
        reader.read(raw)
    return Facts(lang=lang, commands=frozenset(commands), identifiers=frozenset(identifiers),
                 numbers=frozenset(reader.numbers), urls=urls, negated=reader.negated,
                 terms=frozenset(reader.terms), directions=frozenset(reader.directions))


# The order the checks are reported in (the first that fails names the miss).
CHECKS = ("lang", "commands", "identifiers", "numbers", "urls", "negated", "terms",
          "directions")


def disagreement(a: Facts, b: Facts) -> str:
    """The first fact `a` and `b` do not share ("" when they share every one)."""
    for name in CHECKS:
        if getattr(a, name) != getattr(b, name):
            return name
    return ""
